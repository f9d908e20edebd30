"""FastAPI service around model.translator.Translator (see app.create_app)."""
