"""The course autograder (see issue: graded exercises)."""
