"""What every feature shares: name rules, configuration, errors, AWS clients, the state table's shared item.

Standard library only at import time (the node agent bundle ships this package's validation module).
"""
