"""Test helper: functions an HTTP client may name (JSON in, JSON out), and one that is not."""


def add(a, b):
    return a + b


def power(x, exp=2):
    return x ** exp


def biggest(*xs):
    return max(xs)


def leak():
    return object()
