"""The dashboard's pages: Jinja2 templates and static files, rendered from the API's
wire data (served by ``api.dashboard``)."""
