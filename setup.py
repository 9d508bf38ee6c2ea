"""Everything is declared in pyproject.toml; this file only adds ``seqbalance_switch.pth``
to the install (wheel and editable): a one-line start-up hook that imports
``_seqbalance_switch`` when ``SEQBALANCE_PATCH`` is set and does nothing otherwise.

A ``.pth`` file must sit in site-packages itself, which pyproject.toml cannot express.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path(__file__).parent / "src" / "seqbalance_switch.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            # An editable wheel is assembled from the install directory, not build_lib.
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.copy_file(str(PTH), str(Path(target, PTH.name)), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH.name))]


setup(cmdclass={"build_py": BuildPyWithPth})
