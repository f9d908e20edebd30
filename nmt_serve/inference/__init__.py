"""Running a model: the Translator facade, the input processor, the model runner, the KV cache and the searches."""
