"""Checking a conversion against torch and finding what went wrong: verify, bisect, one-op
reproductions, the markdown report, core-opset coverage.

Uses torch (lazily where a module is also read without it).
"""
