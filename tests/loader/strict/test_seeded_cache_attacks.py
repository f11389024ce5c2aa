"""Seeded caches attacked by another local user (issue 21, "Private seeded caches").

A real second user, made by `useradd` once per session, attacks each folder nojit seeds and each file it
appends to, in a shared sticky folder that stands for /tmp (TMPDIR points at it, so the runtime folder and
the old default paths `<tmp>/nojit-flashinfer-<uid>`, `<tmp>/nojit-humming-<uid>` are there):

- loose: it pre-creates the folder (or file) as its own, mode 0777 (0666), with a planted `.py` where Humming
  imports from (`tmp/module`), and once nojit has seeded and checked its files it swaps them (a `.so` whose
  constructor writes a marker, a cubin of its own) at the paths FlashInfer, TensorRT-LLM, Humming and
  DeepGEMM load;
- symlink: it pre-creates the folder (or file) as a symlink to a folder (file) of the victim's elsewhere.

The serving process (tests/probes/probe_seeded_cache.py) runs `install()` in strict mode (record mode for the record
file) on small real bundles, then each library's load by path. With the defence on, each attack is refused
with an UnsafePathError naming the path, or made harmless (the default paths are no longer used: a fresh
private runtime folder is), the planted code never runs and the victim's files are untouched. Positive
control: with private_dir's checks turned into no-ops and its walks following symlinks, the same attack
runs the planted code, gets the attacker's cubin read, or writes into the victim's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from tests.support.common import ROOT, have

PROBE = os.path.join(ROOT, "tests", "probes", "probe_seeded_cache.py")
import tests.probes.probe_seeded_cache as probe  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test makes a second user with useradd"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the planted .so"),
    pytest.mark.skipif(not (have("vllm") and have("flashinfer") and have("humming")),
                       reason="needs vLLM, FlashInfer and humming-kernels"),
]
EVIL_CUBIN = b"\x7fELF the attacker's cubin"
EVIL_SHA = hashlib.sha256(EVIL_CUBIN).hexdigest()
PROTECTED_SYMLINKS = open("/proc/sys/fs/protected_symlinks").read().strip() == "1" \
    if os.path.exists("/proc/sys/fs/protected_symlinks") else False


@pytest.fixture(scope="session")
def attacker():
    name = f"nojit-att-{secrets.token_hex(3)}"
    try:
        made = subprocess.run(["useradd", "-r", "-M", "-U", "-s", "/usr/sbin/nologin", name], capture_output=True,
                              text=True)
    except OSError as exc:
        pytest.skip(f"useradd cannot run here: {exc}")
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()[:200]}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(scope="session")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("seed-bundles")
    (out / "good.c").write_text("int nojit_good(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out / "good.so"), str(out / "good.c")], check=True)
    made = subprocess.run([sys.executable, PROBE, "make", str(out), str(out / "good.so")], capture_output=True,
                          text=True, timeout=900, cwd=ROOT)
    assert made.returncode == 0, made.stderr[-3000:]
    return {n: str(out / f"{n}.nojit") for n in ("flashinfer", "flashinfer-gemm", "humming", "deepgemm")}


def tree(path: str) -> dict:
    """Every name under path with its mode and content digest (lstat: links are not followed)."""
    out = {}
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, path)] = (oct(st.st_mode), st.st_uid, digest)
    return out


class Scene:
    """The shared sticky folder, the attacker's kit, the victim's own folder, and runs of the serving probe."""

    def __init__(self, tmp_path, who) -> None:
        self.who = who
        self.tmp = tmp_path
        # like /tmp: sticky, world-writable, owned by root, reachable by the attacker (tmp_path is not)
        self.shared = pathlib.Path(tempfile.mkdtemp(prefix="nojit-shared-", dir="/tmp"))
        os.chmod(self.shared, 0o1777)
        self.kit = self.shared / "kit"
        self.kit.mkdir()
        self.markers = tmp_path / "markers"  # the victim writes them if the attacker's code runs inside it
        self.markers.mkdir()
        self.so_marker, self.py_marker = self.markers / "so-ran", self.markers / "py-ran"
        (self.kit / "evil.c").write_text(
            '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen("'
            f'{self.so_marker}", "w"); if (f) {{ fputs("attacker code ran", f); fclose(f); }} }}\n')
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(self.kit / "evil.so"), str(self.kit / "evil.c")], check=True)
        (self.kit / "evil.cubin").write_bytes(EVIL_CUBIN)
        (self.kit / "evil.py").write_text(f"open({str(self.py_marker)!r}, 'w').write('attacker code ran')\n"
                                          f"def {probe.MODULE_FUNC}():\n    return 666\n")
        for p in self.kit.iterdir():
            os.chmod(p, 0o644)
        os.chmod(self.kit, 0o755)
        self.victim = tmp_path / "victim"  # a folder and a file of the victim's, elsewhere
        (self.victim / "sub").mkdir(parents=True)
        (self.victim / "victim.log").write_text("the victim's own file\n")
        (self.victim / "sub" / "keep.so").write_bytes(b"the victim's library")
        os.chmod(self.victim / "sub" / "keep.so", 0o755)
        self.victim_before = tree(str(self.victim))

    def as_attacker(self, script: str) -> None:
        done = subprocess.run(["/bin/sh", "-c", script], user=self.who.pw_uid, group=self.who.pw_gid,
                              extra_groups=[], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr

    def loose(self, path, planted_py: str | None = None) -> None:
        """The attacker's own folder at `path`, mode 0777; a planted .py in `planted_py` below it."""
        script = f"mkdir -p '{path}' && chmod 0777 '{path}'"
        if planted_py:
            target = os.path.join(str(path), planted_py)
            script += (f" && mkdir -p '{target}' && chmod 0777 '{target}' && "
                       f"cp '{self.kit / 'evil.py'}' '{target}/{probe.humming_module_name()}.py'")
        self.as_attacker(script)

    def swap_script(self, base) -> str:
        """Run as the attacker after install: every seeded file under `base` replaced by the attacker's."""
        path = self.shared / f"swap-{secrets.token_hex(3)}.sh"
        path.write_text(f"""BASE='{base}'
moved=""
swap() {{
  p=$1; rel=${{p#$BASE/}}; [ -n "$p" ] && [ "$rel" != "$p" ] || return 0
  top=${{rel%%/*}}
  case " $moved " in *" $top "*) ;; *) mv "$BASE/$top" "$BASE/$top.gone" || return 0; moved="$moved $top" ;; esac
  mkdir -p "$(dirname "$p")" && cp "$2" "$p"
}}
swap "$SEEDED_FI_SO" '{self.kit / 'evil.so'}'
swap "$SEEDED_TRT_CUBIN" '{self.kit / 'evil.cubin'}'
swap "$SEEDED_HUMMING_CUBIN" '{self.kit / 'evil.cubin'}'
swap "$SEEDED_DG_CUBIN" '{self.kit / 'evil.cubin'}'
true
""")
        os.chmod(path, 0o644)
        return str(path)

    def run(self, bundle: str, defence: bool = True, after: str | None = None, mode: str = "strict",
            **env: str) -> dict:
        out = self.tmp / f"result-{secrets.token_hex(3)}.json"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("NOJIT_", "HUMMING_", "TRTLLM_", "DG_JIT"))
                 and k not in ("XDG_RUNTIME_DIR", "CUDA_HOME", "CUDA_PATH")}
        clean.update(NOJIT_QUIET="1", CUDA_VISIBLE_DEVICES="", TMPDIR=str(self.shared), NOJIT_TEST_MODE=mode,
                     NOJIT_TEST_ATTACKER_UID=str(self.who.pw_uid), NOJIT_TEST_ATTACKER_GID=str(self.who.pw_gid),
                     **env)
        if not defence:
            clean["NOJIT_TEST_DEFENCE_OFF"] = "1"
        if after:
            clean["NOJIT_TEST_ATTACK_AFTER"] = after
        done = subprocess.run([sys.executable, PROBE, "run", bundle, str(out)], capture_output=True, text=True,
                              timeout=600, env=clean, cwd=ROOT)
        assert done.returncode == 0 and out.exists(), done.stderr[-4000:]
        return json.loads(out.read_text())

    def nothing_ran(self) -> None:
        assert not self.so_marker.exists() and not self.py_marker.exists()
        assert tree(str(self.victim)) == self.victim_before  # nothing of the victim's overwritten or chmod-ed


@pytest.fixture
def scene(tmp_path, attacker):
    made = Scene(tmp_path, attacker)
    try:
        yield made
    finally:
        shutil.rmtree(made.shared, ignore_errors=True)


# --------------------------------------------------------------------------- the attacked folders and files
# target -> (bundle, the attacked path below the shared folder, the setting that names it, mode, planted .py under it)
TARGETS = {
    "flashinfer": ("flashinfer", "nojit-flashinfer-0", "NOJIT_FLASHINFER_DIR", "strict", None),  # + TensorRT-LLM's
    "trtllm": ("flashinfer-gemm", "trtllm-cache", "TRTLLM_DG_CACHE_DIR", "strict", None),  # an operator's, no cubins
    "humming": ("humming", "nojit-humming-0", "NOJIT_HUMMING_DIR", "strict", "tmp/module"),  # cache + tmp/module
    "humming-tmp": ("humming", "humming-tmp", "HUMMING_TMP_DIR", "strict", "module"),
    "deepgemm": ("deepgemm", "nojit-deepgemm-0", "NOJIT_DEEPGEMM_DIR", "strict", None),
    "runtime": ("flashinfer", "nojit-0", None, "strict", None),  # every default under it
}
FILES = {"event-log": ("NOJIT_EVENT_LOG", "strict"), "record-file": ("NOJIT_RECORD_FILE", "record")}


def _env(scene, target):
    _, rel, var, _, _ = TARGETS[target]
    return {var: str(scene.shared / rel)} if var else {}


def _attack_loose(scene, target, bundles, defence):
    bundle, rel, _, mode, planted = TARGETS[target]
    path = scene.shared / rel
    scene.loose(path, planted)
    planted_before = tree(str(path))
    result = scene.run(bundles[bundle], defence, scene.swap_script(path), mode, **_env(scene, target))
    return result, path, planted_before


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_loose_folder_of_another_user_is_refused(scene, bundles, target):
    result, path, planted_before = _attack_loose(scene, target, bundles, defence=True)
    assert result.get("error") == "UnsafePathError", result
    assert str(path) in result["message"], result["message"]
    scene.nothing_ran()
    assert tree(str(path)) == planted_before  # the attacker's own files: nothing written or chmod-ed there either


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_positive_control_the_loose_folder_attack_works_without_the_checks(scene, bundles, target):
    result, path, _ = _attack_loose(scene, target, bundles, defence=False)
    assert "error" not in result, result
    assert result["attack"]["rc"] == 0, result["attack"]
    if target in ("flashinfer", "runtime"):
        assert scene.so_marker.exists(), result  # the attacker's constructor ran inside the server
        assert result["trt_cubin"] == EVIL_SHA  # TensorRT-LLM would load the attacker's cubin
    if target == "humming":
        assert result["humming_cubin"] == EVIL_SHA
    if target in ("humming", "humming-tmp"):
        assert scene.py_marker.exists() and result["humming_module"]["value"] == 666, result
    if target == "deepgemm":
        assert result["dg_cubin"] == EVIL_SHA
    if target == "trtllm":  # TensorRT-LLM's Compiler would look for its cubins in the attacker's folder
        assert result["env"]["TRTLLM_DG_CACHE_DIR"] == str(path)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_symlinked_folder_is_refused(scene, bundles, target):
    bundle, rel, _, mode, _ = TARGETS[target]
    path = scene.shared / rel
    scene.as_attacker(f"ln -s '{scene.victim}' '{path}'")
    result = scene.run(bundles[bundle], True, None, mode, **_env(scene, target))
    assert result.get("error") == "UnsafePathError" and str(path) in result["message"], result
    scene.nothing_ran()


def test_positive_control_a_symlinked_folder_is_written_through_without_the_checks(scene, bundles):
    if PROTECTED_SYMLINKS:
        pytest.skip("fs.protected_symlinks=1: the kernel itself refuses to follow another user's link in /tmp")
    path = scene.shared / "nojit-flashinfer-0"
    scene.as_attacker(f"ln -s '{scene.victim}' '{path}'")
    result = scene.run(bundles["flashinfer"], False, None, NOJIT_FLASHINFER_DIR=str(path))
    assert "error" not in result, result
    assert tree(str(scene.victim)) != scene.victim_before  # the server wrote (and chmod-ed) into the victim's folder


@pytest.mark.parametrize("target", sorted(FILES))
@pytest.mark.parametrize("attack", ["loose", "symlink"])
def test_event_log_and_record_file_of_another_user_or_a_symlink_are_refused(scene, bundles, target, attack):
    var, mode = FILES[target]
    path = scene.shared / f"{target}.jsonl"
    if attack == "loose":
        scene.as_attacker(f"touch '{path}' && chmod 0666 '{path}'")
    else:
        scene.as_attacker(f"ln -s '{scene.victim / 'victim.log'}' '{path}'")
    result = scene.run(bundles["flashinfer"], True, None, mode, **{var: str(path)})
    assert result.get("error") == "UnsafePathError" and str(path) in result["message"], result
    scene.nothing_ran()
    if attack == "loose":
        assert path.read_text() == ""


@pytest.mark.parametrize("target", sorted(FILES))
def test_positive_control_a_symlinked_log_is_appended_to_without_the_checks(scene, bundles, target):
    if PROTECTED_SYMLINKS:
        pytest.skip("fs.protected_symlinks=1: the kernel itself refuses to follow another user's link in /tmp")
    var, mode = FILES[target]
    path = scene.shared / f"{target}.jsonl"
    scene.as_attacker(f"ln -s '{scene.victim / 'victim.log'}' '{path}'")
    result = scene.run(bundles["flashinfer"], False, None, mode, **{var: str(path)})
    assert "error" not in result, result
    assert (scene.victim / "victim.log").read_text() != "the victim's own file\n"  # appended through the link


def test_default_folders_planted_by_another_user_are_not_used(scene, bundles):
    """The old default paths pre-created by the attacker (0777, a planted .so at the exact path FlashInfer would
    load, a planted .py in Humming's tmp/module): nojit seeds a fresh private runtime folder instead, the
    attacker's swap after install cannot touch it, and the libraries load the bundle's files."""
    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(bundles["flashinfer"])
    entries = {e.launch.module: e for k in b.kernel_ids() for e in b.entries(k)}
    old_fi = scene.shared / "nojit-flashinfer-0"
    old_so = os.path.join(flashinfer_serving._root_for(entries, str(old_fi)), probe.FI_MODULE)
    scene.as_attacker(f"mkdir -p '{old_so}' && chmod -R 0777 '{old_fi}' && "
                      f"cp '{scene.kit / 'evil.so'}' '{old_so}/{probe.FI_MODULE}.so'")
    scene.loose(scene.shared / "nojit-humming-0", "tmp/module")
    before = tree(str(scene.shared))
    runtime = str(scene.shared / "nojit-0")
    fi = scene.run(bundles["flashinfer"], after=scene.swap_script(runtime))
    assert "error" not in fi, fi
    assert fi["seeded"]["SEEDED_FI_SO"].startswith(runtime + "/") and fi["fi_loaded"] is True
    assert fi["attack"]["rc"] == 0 and fi["trt_cubin"] != EVIL_SHA  # mv in the private folder: permission denied
    hm = scene.run(bundles["humming"], after=scene.swap_script(runtime))
    assert "error" not in hm, hm
    assert hm["humming_module"]["file"].startswith(runtime + "/") and hm["humming_module"]["value"] == 41
    assert hm["humming_cubin"] != EVIL_SHA
    scene.nothing_ran()
    after = tree(str(scene.shared))
    assert {k: v for k, v in after.items() if k in before} == before  # the attacker's trees untouched
