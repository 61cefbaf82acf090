"""Test helper: functions an HTTP client may name (marked ``@primitive(http=True)``, JSON in,
JSON out), one that breaks the JSON rule, and ones that are not offered."""

import json

from scale_ray.live.workflow import primitive


@primitive(http=True)
def add(a, b):
    return a + b


@primitive(http=True)
def power(x, exp=2):
    return x ** exp


@primitive(http=True)
def biggest(*xs):
    return max(xs)


@primitive(http=True)
def leak():  # marked, but returns a non-JSON value: JsonOnly refuses it when it returns
    return object()


def plain(x):  # public but not marked: never callable over HTTP
    return x


@primitive(http=True)
def _secret(x):  # marked but private: never callable over HTTP
    return x


hinted = primitive(compute_gflop=2.0)(plain)  # a primitive, but not marked http
LIMIT = 10  # not a function
dumps = primitive(http=True)(json.dumps)  # marked, but defined in json: wrap it instead
