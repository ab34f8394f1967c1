#!/usr/bin/env bash
# Install vkserve as a systemd service on a Debian edge box, as root:
#   bash deploy/install.sh            from a checkout of this repository
# Creates the `vkserve` system user (in the render/video groups for /dev/dri), a venv under
# /opt/vkserve/venv with this package, /etc/vkserve/vkserve.toml (kept if present), the model
# repository /var/lib/vkserve/models (seeded with the examples), and enables the unit.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=/opt/vkserve

[ "$(id -u)" = 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
missing=()
for pkg in libvulkan1 mesa-vulkan-drivers python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

getent group vkserve >/dev/null || groupadd --system vkserve
if ! getent passwd vkserve >/dev/null; then
  useradd --system --gid vkserve --home-dir /var/lib/vkserve --no-create-home \
    --shell /usr/sbin/nologin --comment "vkserve inference daemon" vkserve
fi
# The unit's SupplementaryGroups=render video fails the start (216/GROUP) when a group is
# missing: `render` comes with udev, which containers and minimal systems lack.
for group in render video; do
  getent group "$group" >/dev/null || groupadd --system "$group"
  usermod -a -G "$group" vkserve
done

install -d -m 0755 "$prefix"
python3 -m venv "$prefix/venv"
"$prefix/venv/bin/python" -m pip install -q --upgrade pip
"$prefix/venv/bin/python" -m pip install -q "$src"
install -m 0644 "$src/README.md" "$prefix/README.md"

install -d -m 0755 /etc/vkserve
[ -e /etc/vkserve/vkserve.toml ] || install -m 0640 -g vkserve "$src/deploy/vkserve.toml" /etc/vkserve/vkserve.toml
install -d -m 0750 -o vkserve -g vkserve /var/lib/vkserve /var/lib/vkserve/models
if [ -z "$(ls -A /var/lib/vkserve/models)" ]; then
  cp -r "$src/vkserve/examples/." /var/lib/vkserve/models/
  chown -R vkserve:vkserve /var/lib/vkserve/models
fi

install -m 0644 "$src/deploy/vkserve.service" /etc/systemd/system/vkserve.service
install -m 0644 "$src/deploy/vkserve.socket" /etc/systemd/system/vkserve.socket  # optional; not enabled
systemctl daemon-reload
systemctl enable --now vkserve.service
echo "vkserve installed: systemctl status vkserve; metrics on http://127.0.0.1:9464/metrics"
