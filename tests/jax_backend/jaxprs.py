"""Reading a traced program: what the tests of a step's forms look for in its jaxpr."""


def equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs inside it (jit, custom_vjp, control flow)."""
    for e in jaxpr.eqns:
        yield e
        for value in e.params.values():
            for inner in value if isinstance(value, list | tuple) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's
                if hasattr(inner, "eqns"):
                    yield from equations(inner)
