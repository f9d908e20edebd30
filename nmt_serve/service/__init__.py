"""The HTTP service (the API process): FastAPI app, routers, schemas, limits and the client of the engine (see app.create_app)."""
