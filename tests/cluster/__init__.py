"""Tests that start several TensorFlow worker processes (MultiWorkerMirroredStrategy on loopback): their own CI step."""
