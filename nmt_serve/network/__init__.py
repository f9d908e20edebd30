"""The network and its checkpoints: ModelConfig, the Transformer, padding and masks, the tokenizer, the checkpoint format and routing."""
