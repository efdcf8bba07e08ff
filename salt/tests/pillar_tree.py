"""What the tests' fake pillar.get shares."""


def lookup(tree, key, default=None):
    """pillar.get's colon path into tree."""
    cur = tree
    for part in key.split(":"):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur
