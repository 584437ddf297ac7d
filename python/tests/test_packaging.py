"""The installed package as a user gets it (pip install . / the wheel), on the CPU:

* its shared libraries (the module _C and libfusedattn.so.N beside it) carry no RUNPATH/RPATH
  entry that is empty or relative (the dynamic loader reads both against the current directory,
  so a library planted where the user runs would be loaded) or absolute (a build-machine
  directory): only $ORIGIN-relative entries (into site-packages/nvidia/*/lib for the CUDA
  wheels), the system loader path doing the rest;
* every backend that is not built says why ("not built: <reason>"), and the backends that the
  build of scripts/build.sh had (FUSEDATTN_EXPECT_BUILT, set by scripts/test.sh) are built here too:
  `pip install .` without any set-up script builds them (cudnn-frontend from the build
  requirement).
"""
import glob
import os
import re
import shutil
import subprocess

import pytest

import fusedattn

PACKAGE_DIR = os.path.dirname(os.path.abspath(fusedattn.__file__))


def _shared_libraries():
    return sorted(p for p in glob.glob(os.path.join(PACKAGE_DIR, "*.so*")) if os.path.isfile(p))


def _search_paths(path):
    """[(tag, [entries])] of the library's DT_RUNPATH / DT_RPATH, read with readelf -d."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = re.search(r"\((RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", line)
        if m:
            found.append((m.group(1), m.group(2).split(":")))
    return found


def bad_entries(entries):
    """The entries a distributed library must not have, each with why."""
    bad = []
    for entry in entries:
        if entry == "":
            bad.append((entry, "empty: the loader reads it as the current directory"))
        elif entry.startswith(("$ORIGIN", "${ORIGIN}")):
            continue
        elif entry.startswith("/"):
            bad.append((entry, "absolute: a build-machine directory"))
        else:
            bad.append((entry, "relative: resolved against the current directory"))
    return bad


def test_the_checker_refuses_what_it_should():
    # The case the issue found ("/usr/local/cuda/lib:"), a relative entry, and good ones.
    assert [e for e, _ in bad_entries("/usr/local/cuda/lib:".split(":"))] == [
        "/usr/local/cuda/lib", ""]
    assert [e for e, _ in bad_entries(["lib", "./x", "$ORIGIN", "$ORIGIN/../nvidia/cudnn/lib"])] \
        == ["lib", "./x"]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_installed_libraries_have_no_unsafe_runpath():
    libraries = _shared_libraries()
    names = [os.path.basename(p) for p in libraries]
    assert any(n.startswith("_C") for n in names), f"no extension module in {PACKAGE_DIR}: {names}"
    problems = []
    for path in libraries:
        for tag, entries in _search_paths(path):
            for entry, why in bad_entries(entries):
                problems.append(f"{os.path.basename(path)} {tag} entry '{entry}': {why}")
    assert not problems, "\n".join(problems)


def test_backends_that_are_not_built_say_why():
    for name, status in fusedattn.backends().items():
        if status.startswith("not built"):
            assert re.match(r"not built: \S.{10,}", status), f"{name}: '{status}' gives no reason"


def test_pip_builds_every_backend_the_build_script_builds():
    expected = os.environ.get("FUSEDATTN_EXPECT_BUILT")
    if expected is None:
        pytest.skip("FUSEDATTN_EXPECT_BUILT not set (scripts/test.sh sets it from build/)")
    status = fusedattn.backends()
    missing = {name: status.get(name) for name in expected.split()
               if status.get(name, "not built: absent").startswith("not built")}
    assert not missing, f"built by scripts/build.sh but not by pip install .: {missing}"
