"""The accelerator: runtime detection, the TPU probe, the host check (no TensorFlow), fd 2's native log."""
