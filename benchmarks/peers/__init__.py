"""Peer harness: the real reference systems (Distributed TensorFlow, PyTorch DDP) beside ralp-pipe's strategies.

Run it as ``python benchmarks/peers --help`` (the package's ``__main__``); :mod:`peers.harness` holds the
driver, :mod:`peers.tf_ps` and :mod:`peers.ddp_rank` the processes it starts on the emulated hosts, and
:mod:`peers.transport` TensorFlow's gRPC transfer benchmark. TensorFlow comes from the ``peers`` extra
(``pip install -e '.[peers]'``), not part of ``make run``'s environment.
"""
