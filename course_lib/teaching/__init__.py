"""The instructors' layer: the checks that follow each exercise (``checks``, one module per lesson), the
exercise generator (``exercises``), the grader (``grading``) and the parameter injection that the grader and
the tests share (``notebooks``). Learners' scripts never import it."""
