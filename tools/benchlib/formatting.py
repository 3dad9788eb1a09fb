"""How the tables write numbers, sizes and verdicts."""


def human_bytes(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return "%d %s" % (n // size, unit)
    return "%d B" % n


def fmt(value, unit=""):
    if value is None:
        return "n/a"
    if unit == "calls/s":
        return "%.0f" % value
    if unit == "us":
        return "%.1f" % value if value < 1000 else "%.0f" % value
    if abs(value) >= 100:
        return "%.0f" % value
    return "%.2f" % value if abs(value) >= 0.1 else "%.3g" % value


def verdict(met):
    return "n/a" if met is None else ("met" if met else "**missed**")


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
