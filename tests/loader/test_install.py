"""install() is once per process: a second call with the same (or no) arguments returns the first
installation; one with other arguments is refused with a typed error naming what differs."""

from __future__ import annotations

import pytest

from nojit.loader.errors import BundleError
from nojit.loader.install import install


def test_second_install_with_other_arguments_is_refused(small_build, tmp_path):
    inst = install(small_build["bundle"], mode="permissive")
    try:
        assert install() is inst
        assert install(small_build["bundle"], mode="permissive") is inst
        other = str(tmp_path / "other.nojit")
        with pytest.raises(BundleError) as err:
            install(other, mode="strict")
        assert "bundle_path=" in err.value.message and other in err.value.message
        assert "mode='strict'" in err.value.message and err.value.fix
    finally:
        inst.uninstall()
