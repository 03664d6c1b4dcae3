"""Live views of a launch: ``progress`` (one compact line per epoch, or a bar in a notebook) and ``panel``
(``LaunchPanel``: Run/Stop widgets, a tab per rank, curves that follow metrics.jsonl)."""


def __getattr__(name):  # imported on use: ipywidgets and matplotlib load only when a view is asked for
    if name == "LaunchPanel":
        from .panel import LaunchPanel

        return LaunchPanel
    if name == "EpochProgress":
        from .progress import EpochProgress

        return EpochProgress
    raise AttributeError(f"module 'course_lib.ui' has no attribute {name!r}")
