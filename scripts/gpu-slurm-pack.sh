#!/usr/bin/env bash
# Builds .gpucheck/root.tar.xz, the Slurm that scripts/gpu-slurm-check.sh runs on a machine with a real NVIDIA GPU
# (which reaches no package registry): Debian sid's Slurm (26.05) with slurm-wlm-nvml-plugin (component contrib;
# Debian 12's packages have no NVML plugin), slurmdbd and MariaDB, in a minimal chroot stripped of what running
# the daemons does not need (about 120 MB, 22 MiB packed). No libnvidia-ml goes in: the check copies the GPU
# machine's own, which matches its driver. Run as root with debootstrap and the Debian mirror reachable:
#   bash scripts/gpu-slurm-pack.sh      (GPU_PACK_DIR: the build directory, /var/tmp/gpucheck)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${GPU_PACK_DIR:-/var/tmp/gpucheck}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
mkdir -p "$work"
if [[ ! -x $work/root/usr/sbin/slurmd ]]; then
    rm -rf --one-file-system "$work/root"
    debootstrap --variant=minbase --components=main,contrib \
        --include=slurmctld,slurmd,slurm-client,slurmrestd,slurmdbd,slurm-wlm-jwt-plugin,slurm-wlm-nvml-plugin,mariadb-server-core,mariadb-client-core \
        sid "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
fi
R=$work/packroot
rm -rf --one-file-system "$R"
cp -a "$work/root" "$R"
L=$R/usr/lib/x86_64-linux-gnu
rm -rf "$R"/var/cache/* "$R/var/lib/apt" "$R/var/lib/dpkg" "$R"/var/log/* \
    "$R"/usr/share/{doc,man,locale,info,lintian,zsh,bash-completion,common-licenses,perl5,bug,dbus-1,polkit-1,factory,gcc,keyrings,pam,pam-configs,debconf,menu,i18n} \
    "$R/usr/lib/locale" "$R/usr/lib/apt" "$R/usr/lib/systemd" "$R/usr/lib/udev" "$R/usr/lib/kernel" "$R/usr/lib/tmpfiles.d" \
    "$L/perl-base" "$L/perl" "$L/gconv" "$L/systemd" "$L/security" \
    "$R/etc/systemd" "$R/etc/apt" "$R/etc/dpkg" "$R/etc/cron.daily"
rm -f "$R"/usr/bin/perl* "$R"/usr/bin/systemd* "$R"/usr/bin/apt* "$R"/usr/bin/dpkg* "$R"/usr/bin/debconf* \
    "$R"/usr/bin/{systemctl,journalctl,networkctl,busctl,loginctl,resolvectl,timedatectl,hostnamectl,localectl} \
    "$R"/usr/bin/{sqv,localedef,varlinkctl,bootctl,udevadm,coredumpctl,portablectl,kernel-install,userdbctl,oomctl,homectl,machinectl} \
    "$L"/libapt-* "$L/libdb-5.3.so" "$L"/libsystemd-shared*
# MariaDB (for slurmdbd): English messages only, no extra client tools.
find "$R/usr/share/mariadb" -mindepth 1 -maxdepth 1 -type d ! -name english ! -name charsets -exec rm -rf {} +
rm -f "$R/usr/bin/mariadb-check" "$R/usr/bin/mariadb-migrate-config-file" "$R/usr/bin/innochecksum"
rm -f "$L"/slurm-wlm/*.a "$L"/slurm-wlm/*.la
find "$R" -name 'libnvidia-ml*' -print -delete # the GPU machine's own is copied in at run time
[[ -f $L/slurm-wlm/gpu_nvml.so ]] || { echo "gpu_nvml.so is missing from the chroot" >&2; exit 1; }
# Every program and plugin left must still find its libraries (the GPU plugins find theirs on the GPU machine).
bad=0
while read -r f; do
    rel=${f#"$R"}
    case $rel in */gpu_nvml.so | */gpu_nvidia.so | */gpu_oneapi.so | */gpu_nrt.so | */gpu_rsmi.so) continue ;; esac
    if chroot "$R" ldd "$rel" 2>&1 | grep -q 'not found'; then
        echo "missing libraries: $rel" >&2
        bad=1
    fi
done < <(find "$R/usr/bin" "$R/usr/sbin" "$L/slurm-wlm" -type f \( -perm -u+x -o -name '*.so*' \) \
    -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
mkdir -p "$repo/.gpucheck"
tar -C "$R" --numeric-owner -cf - . | xz -T2 -9 >"$repo/.gpucheck/root.tar.xz.tmp"
mv "$repo/.gpucheck/root.tar.xz.tmp" "$repo/.gpucheck/root.tar.xz"
grep -qx '/.gpucheck/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.gpucheck/' >>"$repo/.git/info/exclude"
ls -l "$repo/.gpucheck/root.tar.xz"
exit "$bad"
