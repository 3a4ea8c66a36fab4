#!/usr/bin/env bash
# Installs what the VM defaults (issue 6) need from Debian, when missing: libvirt's headers to
# build against, the QEMU driver libvirt embeds, and QEMU (about 30 s the first time, instant
# after). As root, libvirt's QEMU driver also needs the system user libvirt-qemu.
set -euo pipefail
pkgs=(libvirt-dev pkg-config libvirt-daemon-driver-qemu qemu-system-x86)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if ((${#missing[@]})); then
  echo "== apt-get install ${missing[*]}" >&2
  $sudo apt-get update -q >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
if [ "$(id -u)" = 0 ] && ! getent passwd libvirt-qemu >/dev/null; then
  useradd --system --no-create-home --shell /usr/sbin/nologin libvirt-qemu
fi
