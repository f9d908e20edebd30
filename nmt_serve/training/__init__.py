"""Training and evaluation: the resumable trainer, data, multi-way parallel data, sacreBLEU, model cards."""
