"""The dots of a compiled HLO module, for tests that pin the form XLA:CPU runs them in."""

import re


def dots(hlo: str) -> list[tuple[str, str, str, str]]:
    """(result dtype, lhs dtype, rhs dtype, line) of every dot in an HLO module's text,
    fused or not: operand dtypes are looked up in the computation that holds the dot."""
    found = []
    for computation in re.split(r"\n(?=\S)", hlo):
        dtypes = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", computation))
        for m in re.finditer(r"= (\w+)\[[^\]]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\).*", computation):
            found.append((m.group(1), dtypes.get(m.group(2)), dtypes.get(m.group(3)), m.group(0)))
    return found
