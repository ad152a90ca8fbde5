"""A local broker that demands TLS and SCRAM logins: the security path tested for real.

`KafkaCluster(settings, security=ScramTls(users={"alice": SecretStr("...")}))` starts the
broker with its client listener on SASL_SSL (SCRAM-SHA-512, TLS with a certificate for
127.0.0.1 and localhost signed by a CA made here), the users' credentials seeded into
the metadata at format time (`StorageTool format --add-scram`, KIP-900), and the ACL
authorizer on. The controller and inter-broker listeners stay PLAINTEXT on loopback:
they are the cluster talking to itself, and clients are never told about them.

A development and test tool, not a production recipe: the CA's key lives beside the
broker's data, and anyone on the machine can reach the loopback listeners.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from stream_jobs.errors import PrerequisiteMissing, StackError

MECHANISM = "SCRAM-SHA-512"
# KIP-900's default is 4096; the minimum SCRAM allows and what Kafka recommends.
SCRAM_ITERATIONS = 4096
CERT_DAYS = 825
# The names a client may dial the broker by; the certificate is valid for each.
CERT_HOSTS = ("localhost",)
CERT_IPS = ("127.0.0.1",)


@dataclass(frozen=True)
class ScramTls:
    """How the secure listener admits clients.

    `users` (name -> password) are seeded when the broker's storage is formatted; a
    broker formatted earlier keeps the users it had. `super_users` may do anything
    (the authorizer skips ACLs for them); everyone else needs ACLs.
    """

    users: Mapping[str, SecretStr]
    super_users: tuple[str, ...] = ()
    mechanism: str = field(default=MECHANISM, init=False)

    def __post_init__(self) -> None:
        for name in (*self.users, *self.super_users):
            # The format tool's list syntax and principal strings have no escaping.
            if not name or not name.replace("-", "").replace("_", "").isalnum():
                raise StackError(f"SCRAM user name {name!r}: use letters, digits, '-', '_'.")
        for name, password in self.users.items():
            secret = password.get_secret_value()
            if not secret or any(c in secret for c in '"\\,[]= \n'):
                raise StackError(f"The password of SCRAM user {name!r} must be non-empty and "
                                 "free of quotes, backslashes, commas, brackets, '=' and spaces.")

    def redact(self, text: str) -> str:
        """`text` (a tool's output, say) with every user's password replaced by stars."""
        for password in self.users.values():
            text = text.replace(password.get_secret_value(), "**********")
        return text

    def format_args(self) -> list[str]:
        """`--add-scram` arguments for `kafka.tools.StorageTool format`.

        They hold the passwords: the tool has no other way to take them, so they are on
        its command line for the second it runs, and its output is `redact`ed.
        """
        args: list[str] = []
        for name, password in self.users.items():
            args += ["--add-scram",
                     f'{self.mechanism}=[name={name},password="{password.get_secret_value()}",'
                     f"iterations={SCRAM_ITERATIONS}]"]
        return args


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of the local CA and of the broker's certificate it signed."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        """What a client trusts: `STREAM_JOBS_KAFKA_SSL_CAFILE`."""
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def broker_key(self) -> Path:
        return self.folder / "broker.key"

    @property
    def broker_cert(self) -> Path:
        return self.folder / "broker.pem"

    @property
    def broker_keystore(self) -> Path:
        """The broker's key and certificate chain in one file (`ssl.keystore.type=PEM`)."""
        return self.folder / "broker-keystore.pem"

    def exist(self) -> bool:
        return all(p.is_file() for p in (self.ca_cert, self.broker_keystore))


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and a broker certificate for 127.0.0.1 and localhost, made once with openssl.

    Files made earlier are kept, so a restarted broker keeps the certificate its clients
    trust. Keys are readable by their owner only.
    """
    files = TlsFiles(folder)
    if files.exist():
        return files
    if shutil.which("openssl") is None:
        raise PrerequisiteMissing("The openssl command is not installed: run `make setup` "
                                  "(or apt-get install openssl) to make the broker's certificate.")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    sans = ",".join([*(f"DNS:{h}" for h in CERT_HOSTS), *(f"IP:{ip}" for ip in CERT_IPS)])
    csr = folder / "broker.csr"
    ext = folder / "broker.ext"
    ext.write_text(
        f"subjectAltName={sans}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", files.ca_key)
    _openssl("req", "-x509", "-new", "-key", files.ca_key, "-sha256", "-days", str(CERT_DAYS),
             "-subj", "/CN=stream-jobs local CA", "-out", files.ca_cert,
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    # PKCS#8 without a passphrase: what Kafka's PEM keystore reads with no key password.
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", files.broker_key)
    _openssl("req", "-new", "-key", files.broker_key, "-subj", "/CN=localhost", "-out", csr)
    _openssl("x509", "-req", "-in", csr, "-CA", files.ca_cert, "-CAkey", files.ca_key,
             "-CAcreateserial", "-sha256", "-days", str(CERT_DAYS), "-extfile", ext,
             "-out", files.broker_cert)
    for key in (files.ca_key, files.broker_key):
        key.chmod(0o600)
    keystore = files.broker_key.read_text() + files.broker_cert.read_text() + \
        files.ca_cert.read_text()
    files.broker_keystore.touch(mode=0o600)
    files.broker_keystore.write_text(keystore)
    csr.unlink()
    ext.unlink()
    return files


def _openssl(*args: str | Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise StackError(f"openssl {args[0]} failed: {result.stderr.strip()[-400:]}")


def listener_config(security: ScramTls, tls: TlsFiles, *, host: str, port: int,
                    controller_port: int, internal_port: int) -> list[str]:
    """The listener, TLS, SASL and authorizer lines of a secure node's server.properties."""
    supers = ";".join(["User:ANONYMOUS", *(f"User:{u}" for u in security.super_users)])
    mech = security.mechanism.lower()
    return [
        f"listeners=SASL_SSL://{host}:{port},INTERNAL://{host}:{internal_port},"
        f"CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=SASL_SSL://{host}:{port},INTERNAL://{host}:{internal_port}",
        "inter.broker.listener.name=INTERNAL",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL",
        f"sasl.enabled.mechanisms={security.mechanism}",
        f"listener.name.sasl_ssl.{mech}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={tls.broker_keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={tls.ca_cert}",
        "ssl.client.auth=none",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # The PLAINTEXT loopback listeners carry the cluster's own requests (ANONYMOUS).
        f"super.users={supers}",
        "allow.everyone.if.no.acl.found=false",
    ]


__all__ = ["ScramTls", "TlsFiles", "listener_config", "make_tls_files"]
