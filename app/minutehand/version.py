"""The release: one version, read from the installed distribution's metadata
(pyproject.toml's), so the package, `minutehand --version`, the OpenAPI
document and /readyz cannot disagree. The distribution is
minutehand-scheduler (`minutehand` on PyPI is another project); the import
name and the command are minutehand."""
from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "minutehand-scheduler"

try:
    VERSION = metadata.version(DISTRIBUTION)
except metadata.PackageNotFoundError:     # imported from a checkout that was never installed
    VERSION = "0+unknown"
