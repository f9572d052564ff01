"""gptzoo's conformance kit (gptzoo.testing) on this distribution's activation: each check is one test."""

from gptzoo.testing import conformance

test_squared_relu = conformance("activation", "squared_relu")
