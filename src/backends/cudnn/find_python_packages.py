"""Prints where the build's Python has cudnn-frontend's headers and the cuDNN wheel's folder.

Run by CMakeLists.txt beside this file with the build's Python (scikit-build-core's, or one on
PATH). Prints two lines, each empty after '=' when nothing is found:

    frontend=<dir holding cudnn_frontend.h>   (the nvidia-cudnn-frontend wheel: site-packages/include)
    cudnn=<site-packages/nvidia/cudnn>         (nvidia-cudnn-cu12 / -cu13: include/ and lib/)

In pip's isolated build environment sys.path holds the build requirements (nvidia-cudnn-frontend
is one, see pyproject.toml), while sysconfig's paths are those of the environment being installed
into, where a cuDNN wheel would be; both are searched.
"""
import os
import sys
import sysconfig


def site_dirs():
    dirs = []
    for path in sys.path + [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]:
        if path and os.path.isdir(path) and path not in dirs:
            dirs.append(path)
    return dirs


def frontend_dir():
    try:
        from importlib import metadata

        dist = metadata.distribution("nvidia-cudnn-frontend")
        for f in dist.files or ():
            if str(f).replace("\\", "/").endswith("include/cudnn_frontend.h"):
                return os.path.dirname(os.path.abspath(dist.locate_file(f)))
    except Exception:  # not installed, or metadata without a file list
        pass
    for d in site_dirs():
        if os.path.isfile(os.path.join(d, "include", "cudnn_frontend.h")):
            return os.path.join(d, "include")
    return ""


def cudnn_dir():
    for d in site_dirs():
        root = os.path.join(d, "nvidia", "cudnn")
        if os.path.isfile(os.path.join(root, "include", "cudnn_version.h")):
            return root
    return ""


print("frontend=" + frontend_dir())
print("cudnn=" + cudnn_dir())
