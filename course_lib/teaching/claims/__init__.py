"""One module per lesson, ``lessonNN.py`` with ``check(run)``: the claims that lesson makes about its run."""
