"""The operator's questions, on read-only connections (``readonly``): the queries
(``queries``), the health verdict, Prometheus metrics, purge (``retention``)."""
