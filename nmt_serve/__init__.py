"""nmt-serve: a translation service around an encoder-decoder Transformer written in PyTorch.

Subpackages, each importing only those after it: cli, service, training, convert, engine, inference,
text, network (ARCHITECTURE.md draws them and the path of a request through them).
"""
