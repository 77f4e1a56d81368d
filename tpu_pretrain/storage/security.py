"""``storage-check``: is the bucket public, and can the current credentials do what a run needs?

Old tutorials told users to make their bucket public because permissions were hard. This check
finds public access (``allUsers``/``allAuthenticatedUsers`` in IAM or ACLs, or an anonymous request
that succeeds), verifies by real requests that the current credentials can list and read the data
prefix and write and delete under the run prefix, and prints the gcloud commands that grant only
that. It only reads policies and writes (then deletes) one small probe object: nothing here, or
anywhere in tpu_pretrain, ever makes a bucket or object public.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from . import auth, checksums
from .errors import explain
from .gcs import GcsPath, retry

PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
PROBE_NAME = ".tpu-pretrain-access-check-"


@dataclass
class AccessCheck:
    action: str  # list, read, write, delete
    target: str
    ok: bool | None  # None: could not be tried (nothing to read)
    detail: str = ""


@dataclass
class StorageCheckReport:
    bucket: str
    data_prefix: str
    run_prefix: str
    principal: str
    member: str
    public: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    access: list[AccessCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.public and all(c.ok is not False for c in self.access)

    def text(self) -> str:
        lines = [f"Storage check for gs://{self.bucket} (credentials: {self.principal})"]
        if self.public:
            lines.append("  WARNING: the bucket is PUBLIC. Anyone can read (or list) your data and models:")
            lines += [f"    - {p}" for p in self.public]
        else:
            lines.append("  Public access: none found.")
        lines += [f"  note: {n}" for n in self.notes]
        for c in self.access:
            state = "OK" if c.ok else ("skipped" if c.ok is None else "DENIED")
            lines.append(f"  {c.action:<6} {c.target:<50} {state}{': ' + c.detail if c.detail else ''}")
        lines.append("")
        lines.append(least_privilege_commands(self.bucket, self.data_prefix, self.run_prefix, self.member,
                                              remove_public=self.public))
        return "\n".join(lines)


def check_storage(url: str, data_url: str | None = None, run_url: str | None = None) -> StorageCheckReport:
    """Check public access on ``url``'s bucket and what the credentials can do on data and run prefixes."""
    path = GcsPath.parse(url)
    data = GcsPath.parse(data_url) if data_url else path
    run = GcsPath.parse(run_url) if run_url else path
    client = auth.storage_client()
    credentials = auth.current_credentials()
    report = StorageCheckReport(path.bucket, _prefix(data), _prefix(run), auth.describe(credentials),
                                auth.member(credentials))
    bucket = client.bucket(path.bucket)
    _check_iam(bucket, report)
    _check_bucket_settings(bucket, report)
    first = _check_list(client, data, report)
    if data.bucket != run.bucket or report.run_prefix != report.data_prefix:
        _check_list(client, run, report)
    _check_read(client, data, first, report)
    _check_write(client, run, report)
    if not auth.emulator_host():
        _check_anonymous(path.bucket, first, report)
    else:
        report.notes.append("emulator: it does not enforce access control, so no anonymous probe was made.")
    return report


def _prefix(path: GcsPath) -> str:
    return path.name.rstrip("/") + "/" if path.name else ""


def _check_iam(bucket, report: StorageCheckReport) -> None:
    try:
        policy = bucket.get_iam_policy(requested_policy_version=3, retry=retry())
    except Exception as exc:
        report.notes.append(
            "could not read the bucket's IAM policy (needs storage.buckets.getIamPolicy, which a "
            f"least-privilege account rightly lacks: {type(exc).__name__}); ask the bucket owner to run "
            "this check, or rely on the anonymous-access probe below."
        )
        return
    for binding in policy.bindings:
        for m in sorted(set(binding.get("members", ())) & set(PUBLIC_MEMBERS)):
            condition = " (with a condition)" if binding.get("condition") else ""
            report.public.append(f"IAM: {m} has {binding['role']}{condition}")


def _check_bucket_settings(bucket, report: StorageCheckReport) -> None:
    try:
        bucket.reload(retry=retry())
    except Exception:
        return  # needs storage.buckets.get; least-privilege accounts lack it
    config = bucket.iam_configuration
    if config.get("publicAccessPrevention") == "enforced":
        report.notes.append("public access prevention is enforced: the bucket cannot be made public.")
    if config.uniform_bucket_level_access_enabled:
        return
    report.notes.append("uniform bucket-level access is off: object ACLs can still make single objects "
                        "public, and IAM conditions (for per-prefix grants) need it on.")
    for what, acl in (("bucket ACL", bucket.acl), ("default object ACL", bucket.default_object_acl)):
        try:
            acl.reload(retry=retry())
            for entry in acl:
                if entry.get("entity") in PUBLIC_MEMBERS:
                    report.public.append(f"{what}: {entry['entity']} is {entry['role']}")
        except Exception:  # pragma: no cover - ACLs unreadable; IAM was checked above
            continue


def _check_list(client, path: GcsPath, report: StorageCheckReport):
    target = f"gs://{path.bucket}/{_prefix(path)}"
    try:
        blobs = [b for b in client.list_blobs(path.bucket, prefix=_prefix(path), max_results=20, retry=retry())
                 if not b.name.endswith("/") and PROBE_NAME not in b.name]
        report.access.append(AccessCheck("list", target, True))
        return blobs[0] if blobs else None
    except Exception as exc:
        report.access.append(AccessCheck("list", target, False, str(explain(exc, target, "list it"))))
        return None


def _check_read(client, path: GcsPath, first, report: StorageCheckReport) -> None:
    if first is None:
        report.access.append(AccessCheck("read", f"gs://{path.bucket}/{_prefix(path)}", None,
                                         "no object there to read yet"))
        return
    target = f"gs://{path.bucket}/{first.name}"
    try:
        first.download_as_bytes(start=0, end=min(1023, max(0, int(first.size or 1) - 1)), raw_download=True,
                                retry=retry())
        report.access.append(AccessCheck("read", target, True))
    except Exception as exc:
        report.access.append(AccessCheck("read", target, False, str(explain(exc, target, "read it"))))


def _check_write(client, path: GcsPath, report: StorageCheckReport) -> None:
    name = f"{_prefix(path)}{PROBE_NAME}{uuid.uuid4().hex[:12]}"
    target = f"gs://{path.bucket}/{name}"
    blob = client.bucket(path.bucket).blob(name)
    data = b"tpu-pretrain access check; safe to delete\n"
    blob.crc32c = checksums.crc32c_bytes(data)
    try:
        blob.upload_from_string(data, content_type="text/plain", checksum=None, retry=None)
        report.access.append(AccessCheck("write", target, True))
    except Exception as exc:
        report.access.append(AccessCheck("write", target, False, str(explain(exc, target, "write it"))))
        return
    try:
        blob.delete(retry=retry())
        report.access.append(AccessCheck("delete", target, True, "needed to replace and prune checkpoints"))
    except Exception as exc:
        report.access.append(AccessCheck("delete", target, False, str(explain(exc, target, "delete it"))))


def _check_anonymous(bucket: str, first, report: StorageCheckReport) -> None:
    """Ask Cloud Storage without credentials: if it answers, the data is public whatever IAM says."""
    import requests

    probes = [("list", f"https://storage.googleapis.com/storage/v1/b/{bucket}/o?maxResults=1")]
    if first is not None:
        probes.append(("read", f"https://storage.googleapis.com/{bucket}/{first.name}"))
    for action, url in probes:
        try:
            response = requests.get(url, headers={"Range": "bytes=0-0"}, timeout=15)
        except requests.RequestException:
            report.notes.append("anonymous-access probe could not reach storage.googleapis.com.")
            return
        if response.status_code in (200, 206):
            report.public.append(f"an anonymous request could {action} {url}")


def least_privilege_commands(bucket: str, data_prefix: str, run_prefix: str, member: str,
                             remove_public=()) -> str:
    """gcloud commands granting read on the data prefix and write on the run prefix, nothing more."""
    b = bucket
    lines = ["How to grant only what a run needs (run as the bucket owner; replace the member if needed):"]
    if remove_public:
        lines.append("# Remove public access, and prevent it from coming back:")
        for entry in remove_public:
            if entry.startswith("IAM: "):
                who, _, role = entry[5:].partition(" has ")
                role = role.split(" ")[0]
                lines.append(f"gcloud storage buckets remove-iam-policy-binding gs://{b} --member={who} "
                             f"--role={role}")
        lines.append(f"gcloud storage buckets update gs://{b} --public-access-prevention")
    lines += [
        "# Per-prefix grants use IAM conditions, which need uniform bucket-level access:",
        f"gcloud storage buckets update gs://{b} --uniform-bucket-level-access",
        f"# Read (get + list) on the data prefix gs://{b}/{data_prefix}:",
        _condition_file("read-data.yaml", "read-data", b, data_prefix),
        f"gcloud storage buckets add-iam-policy-binding gs://{b} --member={member} "
        "--role=roles/storage.objectViewer --condition-from-file=read-data.yaml",
        f"# Write (create, overwrite, delete for checkpoint pruning, list) on the run prefix "
        f"gs://{b}/{run_prefix}:",
        _condition_file("write-run.yaml", "write-run", b, run_prefix),
        f"gcloud storage buckets add-iam-policy-binding gs://{b} --member={member} "
        "--role=roles/storage.objectUser --condition-from-file=write-run.yaml",
        "# On a TPU VM or Colab/Kaggle with a service-account key, the member is that service account.",
        "# Never grant allUsers or allAuthenticatedUsers: keys and signed-in users are enough.",
    ]
    return "\n".join(lines)


def _condition_file(filename: str, title: str, bucket: str, prefix: str) -> str:
    objects = f"projects/_/buckets/{bucket}/objects/{prefix}"
    return (
        f"cat > {filename} <<'EOF'\n"
        f"title: {title}\n"
        f"expression: >-\n"
        f"  resource.name.startsWith(\"{objects}\") ||\n"
        f"  (resource.type == \"storage.googleapis.com/Bucket\" &&\n"
        f"   api.getAttribute(\"storage.googleapis.com/objectListPrefix\", \"\").startsWith(\"{prefix}\"))\n"
        f"EOF"
    )
