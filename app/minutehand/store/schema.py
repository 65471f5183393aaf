"""The schema every object of ours lives in, and how our own connections
find it: `search_path=minutehand` set at connect (libpq options), so named
statements and tests' SQL read `jobs`, `claim_due(...)` unqualified. Our
connections also start with JIT compilation off: every statement of ours
runs in milliseconds, and one whose estimate overshoots `jit_above_cost`
(the planner seeing thousands of claim reminders due where there are a
few hundred) spent 200-300 ms compiling a plan before it ran."""
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SCHEMA = "minutehand"
SEARCH_PATH = f"-c search_path={SCHEMA}"
JIT_OFF = "-c jit=off"


def options(database_url: str) -> str:
    """The libpq `options` for a connection of ours: the URL's own, plus the
    search path and JIT off where the URL does not set them."""
    own = conninfo_to_dict(database_url).get("options") or ""
    ours = [o for name, o in (("search_path", SEARCH_PATH), ("jit", JIT_OFF)) if name not in own]
    return " ".join([own, *ours]).strip()


def conninfo(database_url: str) -> str:
    """The URL as a conninfo string whose connections start with our search path."""
    return make_conninfo(database_url, options=options(database_url))


def url(database_url: str) -> str:
    """A postgresql:// URL whose connections start with our search path (for
    tools that take a URL: the migrations, a server process, pgbench)."""
    if "search_path" in database_url:
        return database_url
    return database_url + ("&" if "?" in database_url else "?") + "options=-c%20search_path%3D" + SCHEMA
