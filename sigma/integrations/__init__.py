"""sigma.kpi for the frameworks researchers train with: a Hugging Face `transformers` callback (hf.py), a PyTorch
Lightning callback (lightning.py), and the torch pieces both use and a plain PyTorch loop calls itself (torch.py).
Each module imports only its own framework, on first use; docs/own-trainer.md shows each in a training script."""
