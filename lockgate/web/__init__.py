"""lockgate.web: the REST API a driver serves for its jobs (``rest``)."""
