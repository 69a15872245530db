"""The dashboard's pages: pure rendering of plain data into HTML (served by ``api``)."""
