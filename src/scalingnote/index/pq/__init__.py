"""Learned product quantization (TMJ, Huang et al., KDD'23)."""
