"""Inference: KV-cached batched decoding (generate), the sampler chain (sampling),
few-row CPU products through native kernels (matvec, native) and weight-only int8 (quantize)."""
