"""What an exercise release holds in place of an answer, apart from the nbgrader machinery that reads notebooks.

A check asks whether a learner's file still holds the placeholder (``checks.harness.has_placeholder``) in the
kernel that grades it; importing ``exercises`` there would import nbformat and jsonschema (about 2.5 s on 2 cores,
most of it jsonschema building its IRI grammar) in every graded notebook's kernel.
"""

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ('# YOUR CODE HERE\n'
             'raise NotImplementedError("replace these two lines with your answer, then run the check below")')
MARKDOWN_ANSWER = "YOUR ANSWER HERE"
