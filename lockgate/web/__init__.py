"""lockgate.web: the REST API a driver serves for its jobs (``server``,
``routes``, ``serving``), the discovery files that let clients find them
(``discovery``), and the CLI's client (``client``)."""
