/**
 * What every container and infra process gets in its OCI spec unless it is
 * privileged: the /proc and /sys paths masked or made read-only, as Docker,
 * containerd and CRI-O set them.
 */
export const DEFAULT_MASKED = [
  '/proc/acpi', '/proc/asound', '/proc/kcore', '/proc/keys', '/proc/latency_stats', '/proc/timer_list',
  '/proc/timer_stats', '/proc/sched_debug', '/proc/scsi', '/sys/firmware', '/sys/devices/virtual/powercap',
];
export const DEFAULT_READONLY = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];
