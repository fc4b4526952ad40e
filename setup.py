"""Build hook: copy the top-level `models/` and `dashboards/` into the wheel as `rla_ablate/_bundled/`.

Everything else lives in pyproject.toml. The folders stay where they are in the repository (one source);
an editable install reads them in place (rla_ablate/resources.py), so only a real build copies them.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = {"models": "*.yaml", "dashboards": "**/*.yaml"}


class BuildPyWithBundled(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder, pattern in BUNDLED.items():
            for src in sorted((ROOT / folder).glob(pattern)):
                dest = Path(self.build_lib) / "rla_ablate" / "_bundled" / folder / src.relative_to(ROOT / folder)
                self.mkpath(str(dest.parent))
                self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithBundled})
