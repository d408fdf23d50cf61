"""hpops node agent: keeps a HyperPod login node's SSH host identity and login limits as the stack wants them."""

__version__ = "1.0.0"
