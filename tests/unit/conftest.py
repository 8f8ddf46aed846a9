"""Hypothesis settings for the property tests: no per-example deadline, since the tests
run on shared machines where one slow example says nothing about the code."""

from hypothesis import settings

settings.register_profile("bootseer", deadline=None)
settings.load_profile("bootseer")
