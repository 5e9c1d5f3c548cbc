"""The ledger against the world: the check (``check``), the drift report it returns
(``drift``), the last verdicts kept (``runs``)."""
