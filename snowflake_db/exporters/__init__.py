"""Exporters of :mod:`snowflake_db.metrics` to monitoring systems, one module per system.

``snowflake_db.exporters.prometheus`` needs the ``prometheus`` extra (prometheus_client) and
``snowflake_db.exporters.opentelemetry`` the ``opentelemetry`` extra (opentelemetry-api);
importing one without its package raises :class:`snowflake_db.MissingExtraError`.
Both read :func:`snowflake_db.metrics.snapshot` when scraped or collected, never per ID.
Behind a prefork server, ``snowflake_db.exporters.prometheus_multiprocess`` (same extra) copies
each worker's figures into prometheus_client's multiprocess files, to be summed at scrape time.
"""
