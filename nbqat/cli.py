"""STUB: being written; replace this whole file."""


def main(argv=None):  # STUB
    raise NotImplementedError
