"""The HyperPod cluster as every feature sees it: its EventBridge events and its login group's nodes."""
