"""Keeps the build out of the source tree: setuptools writes its build/
and kvshare.egg-info beside the sources (pip builds in the tree since
21.3); here they go to a scratch folder that is removed when the build
step ends.  The package's metadata is in pyproject.toml."""
import atexit
import os
import shutil
import tempfile

from setuptools import setup

scratch = tempfile.mkdtemp(prefix="kvshare-build-")
atexit.register(shutil.rmtree, scratch, True)
setup(options={"build": {"build_base": os.path.join(scratch, "build")},
               "egg_info": {"egg_base": scratch}})
