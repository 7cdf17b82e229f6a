"""The process that owns TensorFlow: protocol, host lock, server, the dashboard's handle, the lane, the runner.

``python -m tpudash.engine`` is the engine process. The dashboard imports the
handle and the lane, which never import TensorFlow; the server and the runner
run jobs.
"""
