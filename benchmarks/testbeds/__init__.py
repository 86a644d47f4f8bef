"""Shared test beds: what more than one question measures on.

Each module takes arguments (never a runner's constants) and imports no question.
"""
