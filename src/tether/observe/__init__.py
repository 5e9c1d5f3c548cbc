"""The operator's questions, on read-only connections (``readonly``): the ``tether status``
verdict (``backlog``, ``verdict``, ``health``), finding jobs (``jobs``, ``pages``), what
finished (``finished``), ``stuck``, ``durations``, ``duplicates``, what jobs paid
(``billing``), Prometheus metrics (``metrics``, ``tally``), purge (``retention``)."""
