"""`hpops`: the operator command line (status, repair, host-keys, lifecycle); main.py holds the commands."""
