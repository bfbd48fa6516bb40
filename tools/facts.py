"""A knowledge lookup over a small bundled table (chemical elements), answering one property per query.

The table is a Python constant: installed with the package, found without any file path. A query that names
an element and a property ("atomic number of tungsten") gets the value alone; one that names only the
element gets its whole entry.
"""

from __future__ import annotations

import re

from agentic_grpo import ToolEnvironment

# name -> (symbol, atomic number, standard atomic weight rounded to two decimals)
ELEMENTS: dict[str, tuple[str, int, str]] = {
    "hydrogen": ("H", 1, "1.01"), "helium": ("He", 2, "4.00"), "lithium": ("Li", 3, "6.94"),
    "beryllium": ("Be", 4, "9.01"), "boron": ("B", 5, "10.81"), "carbon": ("C", 6, "12.01"),
    "nitrogen": ("N", 7, "14.01"), "oxygen": ("O", 8, "16.00"), "fluorine": ("F", 9, "19.00"),
    "neon": ("Ne", 10, "20.18"), "sodium": ("Na", 11, "22.99"), "magnesium": ("Mg", 12, "24.31"),
    "aluminium": ("Al", 13, "26.98"), "silicon": ("Si", 14, "28.09"), "phosphorus": ("P", 15, "30.97"),
    "sulfur": ("S", 16, "32.06"), "chlorine": ("Cl", 17, "35.45"), "argon": ("Ar", 18, "39.95"),
    "potassium": ("K", 19, "39.10"), "calcium": ("Ca", 20, "40.08"), "titanium": ("Ti", 22, "47.87"),
    "chromium": ("Cr", 24, "52.00"), "manganese": ("Mn", 25, "54.94"), "iron": ("Fe", 26, "55.85"),
    "cobalt": ("Co", 27, "58.93"), "nickel": ("Ni", 28, "58.69"), "copper": ("Cu", 29, "63.55"),
    "zinc": ("Zn", 30, "65.38"), "bromine": ("Br", 35, "79.90"), "krypton": ("Kr", 36, "83.80"),
    "silver": ("Ag", 47, "107.87"), "tin": ("Sn", 50, "118.71"), "iodine": ("I", 53, "126.90"),
    "xenon": ("Xe", 54, "131.29"), "tungsten": ("W", 74, "183.84"), "platinum": ("Pt", 78, "195.08"),
    "gold": ("Au", 79, "196.97"), "mercury": ("Hg", 80, "200.59"), "lead": ("Pb", 82, "207.20"),
    "uranium": ("U", 92, "238.03"),
}  # fmt: skip
ALIASES = {"aluminum": "aluminium", "sulphur": "sulfur"}
PROPERTIES = {"symbol": 0, "atomic number": 1, "atomic mass": 2}
_PROPERTY_WORDS = [
    (re.compile(r"symbol", re.I), "symbol"),
    (re.compile(r"atomic\s*number|proton", re.I), "atomic number"),
    (re.compile(r"mass|weight", re.I), "atomic mass"),
]


def element_property(name: str, prop: str) -> str:
    """The table's value of `prop` (`symbol`, `atomic number`, `atomic mass`) for element `name`."""
    return str(ELEMENTS[name][PROPERTIES[prop]])


class ElementTable(ToolEnvironment):
    """Facts from the bundled table of chemical elements."""

    def lookup(self, query: str) -> str:
        """Look a fact up in the reference table of chemical elements: symbol, atomic number, atomic mass.

        Args:
            query: The element and what to know about it, e.g. "atomic number of tungsten".
        """
        words = re.findall(r"[a-z]+", query.lower())
        names = [ALIASES.get(w, w) for w in words if ALIASES.get(w, w) in ELEMENTS]
        if not names:
            raise ValueError(f"no element named in {query!r}; the table holds {len(ELEMENTS)} chemical elements "
                             "(e.g. \"atomic number of iron\")")  # fmt: skip
        name = names[0]
        for pattern, prop in _PROPERTY_WORDS:
            if pattern.search(query):
                return element_property(name, prop)
        symbol, number, mass = ELEMENTS[name]
        return f"{name}: symbol {symbol}, atomic number {number}, atomic mass {mass}"
