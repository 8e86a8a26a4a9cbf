/* vgpud's Cockpit page.
 *
 * It talks to dev.vgpud1 on the system bus and to nothing else. State comes
 * from the ObjectManager at /dev/vgpud1 (cockpit.dbus proxies: one
 * GetManagedObjects, then InterfacesAdded/InterfacesRemoved and
 * PropertiesChanged keep it current), so nothing is polled except the share
 * readings, for which vgpud emits no signal. Every change is a dev.vgpud1
 * method; a refusal is shown with vgpud's D-Bus error name and message.
 *
 * Strings go through cockpit.gettext, so the page is translation-ready.
 */
(function () {
    "use strict";

    const _ = cockpit.gettext;
    const BUS = "dev.vgpud1";
    const ROOT = "/dev/vgpud1";
    const MANAGER = "dev.vgpud1.Manager";
    const ERROR_PREFIX = "dev.vgpud1.Error.";
    // vgpud cancels and undoes an operation at this caller timeout.
    const TIMEOUT_MS = 120000;
    const ACTIVITY_MS = 2000;
    const UNLIMITED = 18446744073709551615;
    // Bounds ListDomains: a libvirt that does not answer leaves the VM
    // field a text field, with why, rather than a page waiting.
    const DOMAINS_MS = 10000;

    // superuser "try": with Cockpit's administrative access on, calls go
    // through the root bridge (root may read and change); without it, as the
    // logged-in user, whom vgpud authorizes itself (group vgpud, polkit).
    const client = cockpit.dbus(BUS, { bus: "system", superuser: "try" });
    const gpus = client.proxies("dev.vgpud1.GPU", ROOT);
    const instances = client.proxies("dev.vgpud1.Instance", ROOT);
    const tenants = client.proxies("dev.vgpud1.Tenant", ROOT);
    const manager = client.proxy(MANAGER, ROOT);

    const state = {
        tab: "gpus",
        canRead: false,
        canManage: false,
        domains: null, // libvirt's VMs [{name, uuid, state}]; null: not listed
        domainsError: "",
        profiles: {}, // model -> [{name, kind, vram, compute}]
        capacity: {}, // model + "/" + profile -> count
        shares: [],
        manager: {}, // the Manager's properties
        activityTimer: null,
        opSeq: 0,
    };

    /* ---------- helpers ---------- */

    function $(id) {
        return document.getElementById(id);
    }

    function el(tag, attrs, children) {
        const e = document.createElement(tag);
        Object.keys(attrs || {}).forEach(function (k) {
            if (k === "text")
                e.textContent = attrs[k];
            else if (k === "class")
                e.className = attrs[k];
            else if (k.indexOf("on") === 0)
                e.addEventListener(k.substring(2), attrs[k]);
            else if (attrs[k] !== undefined && attrs[k] !== null && attrs[k] !== false)
                e.setAttribute(k, attrs[k] === true ? "" : String(attrs[k]));
        });
        (children || []).forEach(function (c) {
            if (c !== null && c !== undefined)
                e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
        });
        return e;
    }

    function clear(node) {
        while (node.firstChild)
            node.removeChild(node.firstChild);
    }

    // uint64 values arrive as JSON numbers; UINT64_MAX ("unlimited") comes
    // out as 2^64 or, from a bridge that writes it as int64, as -1.
    function unlimited(v) {
        return v === undefined || v < 0 || v >= UNLIMITED;
    }

    function gib(bytes) {
        const g = bytes / (1024 * 1024 * 1024);
        return (Math.round(g * 100) / 100) + " GiB";
    }

    function gpusText(milli) {
        return String(Math.round(milli) / 1000);
    }

    function shortUUID(u) {
        return (u || "").substring(0, 8);
    }

    function list(proxies) {
        return Object.keys(proxies).map(function (p) {
            return proxies[p];
        }).filter(function (p) {
            return p.valid !== false;
        });
    }

    function byKey(key) {
        return function (a, b) {
            return String(a[key]).localeCompare(String(b[key]));
        };
    }

    // A tenant's colour: a stable hue from its name.
    function tenantColour(name) {
        let h = 0;
        for (let i = 0; i < name.length; i++)
            h = (h * 31 + name.charCodeAt(i)) % 360;
        return "hsl(" + h + ", 55%, 52%)";
    }

    // managerCall calls a Manager method and returns a native Promise:
    // cockpit's own promises do not catch what a handler throws, so a
    // chain that rethrows an error must not run on them.
    function managerCall(method, args, options) {
        return new Promise(function (resolve, reject) {
            client.call(ROOT, MANAGER, method, args, options).then(resolve, reject);
        });
    }

    /* ---------- errors, progress ---------- */

    function showError(ex) {
        const name = ex && ex.name ? ex.name : "";
        const msg = ex && ex.message ? ex.message : String(ex);
        $("error-name").textContent = name;
        $("error-message").textContent = msg;
        $("error").hidden = false;
    }

    function clearError() {
        $("error").hidden = true;
        $("error-name").textContent = "";
        $("error-message").textContent = "";
    }

    // call runs a Manager method that changes state: with vgpud's timeout and
    // an operation id, a progress line with Cancel while it runs, and
    // vgpud's named error shown when it fails.
    function call(what, method, signature, args, extra) {
        clearError();
        state.opSeq += 1;
        const opid = "cockpit-" + Date.now().toString(36) + "-" + state.opSeq;
        const options = {
            "timeout-ms": cockpit.variant("t", TIMEOUT_MS),
            "operation-id": cockpit.variant("s", opid),
        };
        Object.assign(options, extra || {});
        const line = el("div", { class: "op", "data-op": opid }, [
            el("span", { class: "spinner" }),
            el("span", { text: what }),
            el("button", {
                type: "button",
                class: "btn btn-link",
                text: _("Cancel"),
                onclick: function () {
                    managerCall("Cancel", [opid], { type: "s" }).catch(showError);
                },
            }),
        ]);
        $("ops").appendChild(line);
        return managerCall(method, args.concat([options]), { type: signature + "a{sv}" })
                .catch(function (ex) {
                    showError(ex);
                    throw ex;
                })
                .finally(function () {
                    line.remove();
                });
    }

    function ignore() {}

    /* ---------- access ---------- */

    // setAccess follows vgpud's GetAccess: a session that may read but not
    // change (group vgpud with groupAccess: read, polkit refusing) gets the
    // data with every change control disabled and vgpud's reason; one that
    // may not read gets the reason and no data.
    function setAccess(canRead, canManage, reason) {
        state.canRead = canRead;
        state.canManage = canRead && canManage;
        const banner = $("access");
        if (state.canManage) {
            banner.hidden = true;
            document.body.classList.remove("readonly");
        } else {
            banner.textContent = canRead
                ? cockpit.format(_("Read-only: vgpud lets this session read but not change ($0)."), reason)
                : cockpit.format(_("No access: vgpud refused this session ($0). Reading needs root, group vgpud or Cockpit's administrative access."), reason);
            banner.hidden = false;
            document.body.classList.add("readonly");
        }
        $("access").dataset.level = state.canManage ? "manage" : canRead ? "read" : "none";
        syncManageControls();
    }

    function syncManageControls() {
        document.querySelectorAll(".manage").forEach(function (b) {
            b.disabled = !state.canManage;
            if (!state.canManage)
                b.title = _("Not permitted to perform this action.");
        });
    }

    /* ---------- GPUs ---------- */

    // migSlots is the number of memory slots of a MIG GPU. The API does not
    // publish it: a GPU's memory divided by its smallest GPU-instance
    // profile's (8 on A100/H100, 4 on A30), at least what its instances span.
    function migSlots(gpu) {
        const profs = (state.profiles[gpu.Model] || []).filter(function (p) {
            return p.kind === "mig" && /^1g\./.test(p.name);
        });
        let n = 8;
        if (profs.length > 0 && gpu.MemoryBytes > 0) {
            const smallest = Math.min.apply(null, profs.map(function (p) { return p.vram; }));
            n = Math.round(gpu.MemoryBytes / smallest);
        }
        (gpu.MIGInstances || []).forEach(function (gi) {
            n = Math.max(n, gi[3] + gi[4]);
        });
        return n;
    }

    function instancesOn(pci) {
        return list(instances).filter(function (i) {
            return i.GPU === pci;
        });
    }

    function badge(text, cls) {
        return el("span", { class: "badge " + (cls || ""), text: text });
    }

    function renderMIGGrid(gpu, insts) {
        const slots = migSlots(gpu);
        const grid = el("div", { class: "mig-grid", "data-slots": slots });
        grid.style.gridTemplateColumns = "repeat(" + slots + ", 1fr)";
        for (let s = 0; s < slots; s++) {
            const c = el("div", { class: "slot", text: String(s) });
            c.style.gridColumn = String(s + 1);
            c.style.gridRow = "1";
            grid.appendChild(c);
        }
        (gpu.MIGInstances || []).forEach(function (gi) {
            const giID = gi[0];
            const start = gi[3];
            const size = gi[4];
            const mine = insts.filter(function (i) {
                return i.GPUInstanceStart === start && i.GPUInstanceSize === size && i.GPUInstanceID === giID;
            });
            const owners = Array.from(new Set(mine.map(function (i) { return i.Tenant; })));
            const label = owners.length > 0 ? owners.join(", ") : _("not vgpud's");
            const block = el("div", {
                class: "gi" + (owners.length === 0 ? " foreign" : "") + (mine.some(function (i) { return i.State === "failed" || i.State === "lost"; }) ? " bad" : ""),
                "data-start": start,
                "data-size": size,
                "data-profile": gi[2],
                "data-tenant": owners.join(","),
                "data-uuid": mine.map(function (i) { return i.UUID; }).join(","),
                title: cockpit.format(_("$0 at slots $1–$2"), gi[2], start, start + size - 1),
            }, [
                el("strong", { text: gi[2] }),
                el("span", { text: label }),
                mine.length > 1 ? el("span", { class: "muted", text: cockpit.format(_("$0 compute instances"), mine.length) }) : null,
            ]);
            block.style.gridColumn = (start + 1) + " / span " + size;
            block.style.gridRow = "2";
            if (owners.length > 0)
                block.style.background = tenantColour(owners[0]);
            grid.appendChild(block);
        });
        return grid;
    }

    function renderVGPUs(insts) {
        const byType = {};
        insts.forEach(function (i) {
            const k = i.VGPUType || i.Profile;
            (byType[k] = byType[k] || []).push(i);
        });
        const types = Object.keys(byType).sort();
        if (types.length === 0)
            return el("p", { class: "muted", text: _("No instances.") });
        return el("ul", { class: "vgpus" }, types.map(function (t) {
            return el("li", { "data-type": t }, [
                el("strong", { text: t + " × " + byType[t].length }),
                " ",
            ].concat(byType[t].map(function (i) {
                const chip = el("span", { class: "chip", "data-uuid": i.UUID, text: i.Tenant + (i.VM ? " → " + i.VM : "") });
                chip.style.borderColor = tenantColour(i.Tenant);
                return chip;
            })));
        }));
    }

    function renderGPUs() {
        const box = $("gpus");
        clear(box);
        const all = list(gpus).sort(byKey("PCI"));
        if (state.canRead && all.length === 0)
            box.appendChild(el("p", { class: "muted", text: _("vgpud reports no GPUs.") }));
        all.forEach(function (g) {
            const insts = instancesOn(g.PCI);
            const bad = g.State === "lost" || g.State === "failed";
            let mode;
            if (g.MIGEnabled)
                mode = _("MIG");
            else if (g.VGPUFlavour && g.VGPUFlavour !== "none")
                mode = cockpit.format(_("time-sliced vGPU ($0)"), g.VGPUFlavour);
            else
                mode = _("whole GPU");
            const badges = [
                badge(mode, "mode"),
                badge(g.State, "state state-" + g.State),
            ];
            if (g.SchedulerMode)
                badges.push(badge(_("scheduler") + ": " + g.SchedulerMode + (g.SchedulerPolicy ? " " + g.SchedulerPolicy : "") + (g.SchedulerPending ? " (" + _("pending") + ")" : ""), "sched"));
            // GPUInstanceSchedulers: (id, profile, start, size, mode, policy,
            // time slice µs, pending); the pinned ones (Blackwell GB20x).
            (g.GPUInstanceSchedulers || []).forEach(function (s) {
                if (s[4] === "pinned")
                    badges.push(badge(cockpit.format(_("GPU instance $0 scheduler"), s[0] < 0 ? s[1] + "@" + s[2] : s[0]) + ": " + s[5] + (s[7] ? " (" + _("pending") + ")" : ""), "sched gi-sched"));
            });
            if (g.MIGCapable && g.MIGPending !== g.MIGEnabled)
                badges.push(badge(g.MIGPending ? _("MIG on at next reset") : _("MIG off at next reset"), "pending"));
            const actions = [];
            if (g.MIGCapable) {
                actions.push(el("button", {
                    type: "button",
                    class: "btn manage",
                    text: g.MIGPending ? _("Disable MIG") : _("Enable MIG"),
                    onclick: function () {
                        call(cockpit.format(_("MIG mode on $0"), g.PCI), "SetMIGMode", "sb", [g.PCI, !g.MIGPending]).catch(ignore);
                    },
                }));
            }
            if (g.State === "failed") {
                actions.push(el("button", {
                    type: "button",
                    class: "btn manage",
                    text: _("Return to service"),
                    onclick: function () {
                        call(cockpit.format(_("Clearing $0"), g.PCI), "ClearGPU", "s", [g.PCI]).catch(ignore);
                    },
                }));
            }
            const card = el("article", { class: "card gpu" + (bad ? " gpu-bad" : ""), "data-pci": g.PCI, "data-state": g.State }, [
                el("header", {}, [
                    el("h2", { text: g.PCI }),
                    el("span", { class: "model", text: g.Model || _("model not in catalog") }),
                    el("span", { class: "muted", text: g.Product + " · " + gib(g.MemoryBytes) }),
                ].concat(badges)),
                bad ? el("p", { class: "reason", text: g.Reason || (g.State === "lost" ? _("The GPU fell off the bus.") : "") }) : null,
                g.MIGEnabled ? renderMIGGrid(g, insts) : renderVGPUs(insts),
                (g.Errors || []).length > 0 ? el("p", { class: "reason", text: g.Errors.join("; ") }) : null,
                actions.length > 0 ? el("div", { class: "buttons" }, actions) : null,
            ]);
            box.appendChild(card);
        });
    }

    /* ---------- tenants ---------- */

    function bar(used, quota, fmt) {
        const unl = unlimited(quota);
        const pct = unl ? 0 : quota === 0 ? 100 : Math.min(100, 100 * used / quota);
        const fill = el("div", { class: "fill" + (pct >= 100 ? " full" : pct >= 80 ? " high" : "") });
        fill.style.width = pct + "%";
        return el("div", { class: "usage" }, [
            el("div", { class: "bar" }, [fill]),
            el("span", { class: "usage-text", text: fmt(used) + " / " + (unl ? _("unlimited") : fmt(quota)) }),
        ]);
    }

    function renderTenants() {
        const body = $("tenants");
        clear(body);
        list(tenants).sort(byKey("Name")).forEach(function (t) {
            const dot = el("span", { class: "dot" });
            dot.style.background = tenantColour(t.Name);
            body.appendChild(el("tr", { "data-tenant": t.Name }, [
                el("td", {}, [dot, t.Name]),
                el("td", { text: t.Class }),
                el("td", {}, [bar(t.VRAMUsed, t.VRAMQuota, gib)]),
                el("td", {}, [bar(t.ComputeUsed, t.ComputeQuota, gpusText)]),
                el("td", {}, [bar(t.InstancesUsed, t.MaxInstances, String)]),
                el("td", { class: "actions" }, [
                    el("button", {
                        type: "button",
                        class: "btn btn-link",
                        text: _("Edit"),
                        onclick: function () { fillTenantForm(t); },
                    }),
                    el("button", {
                        type: "button",
                        class: "btn btn-danger manage",
                        text: _("Undefine"),
                        onclick: function () {
                            const force = t.InstancesUsed > 0 && window.confirm(cockpit.format(_("Tenant $0 holds $1 instances. Detach and destroy them?"), t.Name, t.InstancesUsed));
                            call(cockpit.format(_("Undefining $0"), t.Name), "UndefineTenant", "sb", [t.Name, force]).catch(ignore);
                        },
                    }),
                ]),
            ]));
        });
        syncManageControls();
    }

    function fillTenantForm(t) {
        $("tf-name").value = t.Name;
        $("tf-vram").value = unlimited(t.VRAMQuota) ? "" : t.VRAMQuota / (1024 * 1024 * 1024);
        $("tf-compute").value = unlimited(t.ComputeQuota) ? "" : t.ComputeQuota / 1000;
        $("tf-max").value = unlimited(t.MaxInstances) ? "" : t.MaxInstances;
        $("tf-class").value = t.Class || "best-effort";
    }

    // quotaArg turns a form field into a uint64 argument: an empty field is
    // unlimited. Cockpit 287's bridge reads JSON numbers as int64 and
    // refuses negative ones for "t", so UINT64_MAX (vgpud's "unlimited")
    // cannot be sent from here; the quota is sent as 0 and named in the
    // "unlimited" option, which vgpud reads instead of the number.
    function quotaArg(id, scale, name, unl) {
        const v = $(id).value.trim();
        if (v === "") {
            unl.push(name);
            return 0;
        }
        if (isNaN(Number(v)) || Number(v) < 0)
            return null;
        return Math.round(Number(v) * scale);
    }

    // tenantFormArgs returns the form's arguments and the options that go
    // with them, or null (with the error shown).
    function tenantFormArgs() {
        const unl = [];
        const a = [
            $("tf-name").value.trim(),
            quotaArg("tf-vram", 1024 * 1024 * 1024, "vram", unl),
            quotaArg("tf-compute", 1000, "compute", unl),
            quotaArg("tf-max", 1, "instances", unl),
        ];
        if (a.indexOf(null) >= 0) {
            showError({ name: "", message: _("Each quota is a number, or empty for unlimited.") });
            return null;
        }
        return { args: a, options: unl.length ? { unlimited: cockpit.variant("as", unl) } : {} };
    }

    /* ---------- instances ---------- */

    function placement(i) {
        if (i.GPUInstanceStart >= 0 && i.GPUInstanceSize > 0)
            return cockpit.format(_("slots $0–$1"), i.GPUInstanceStart, i.GPUInstanceStart + i.GPUInstanceSize - 1);
        if (i.VF)
            return "VF " + i.VF;
        if (i.MdevUUID)
            return "mdev " + shortUUID(i.MdevUUID);
        return "";
    }

    function syncSelect(sel, values, keepFirst) {
        const cur = sel.value;
        while (sel.options.length > (keepFirst ? 1 : 0))
            sel.remove(sel.options.length - 1);
        values.forEach(function (v) {
            sel.appendChild(el("option", { value: v, text: v }));
        });
        if (values.indexOf(cur) >= 0 || (keepFirst && cur === ""))
            sel.value = cur;
    }

    function renderInstances() {
        const tf = $("filter-tenant").value;
        const gf = $("filter-gpu").value;
        const text = $("filter-text").value.trim().toLowerCase();
        const body = $("instances");
        // A re-render (any property change) must not lose a VM name being
        // typed: keep the inputs' values and focus by instance.
        const typed = {};
        let focused = null;
        body.querySelectorAll("tr[data-uuid]").forEach(function (tr) {
            const inp = tr.querySelector(".vm-choice");
            if (inp && inp.value)
                typed[tr.dataset.uuid] = inp.value;
            if (inp && document.activeElement === inp)
                focused = tr.dataset.uuid;
        });
        clear(body);
        const vms = new Set();
        list(instances).sort(function (a, b) {
            return (a.GPU + a.GPUInstanceStart + a.UUID).localeCompare(b.GPU + b.GPUInstanceStart + b.UUID);
        }).forEach(function (i) {
            if (i.VM)
                vms.add(i.VM);
            if ((tf && i.Tenant !== tf) || (gf && i.GPU !== gf))
                return;
            if (text && [i.UUID, i.Tenant, i.Profile, i.GPU, i.VM, i.State].join(" ").toLowerCase().indexOf(text) < 0)
                return;
            const vmInput = vmChooser();
            vmInput.value = typed[i.UUID] || "";
            const actions = [];
            if (i.VM) {
                actions.push(el("button", {
                    type: "button",
                    class: "btn manage detach",
                    text: _("Detach"),
                    onclick: function () {
                        call(cockpit.format(_("Detaching $0 from $1"), shortUUID(i.UUID), i.VM), "Detach", "s", [i.UUID]).catch(ignore);
                    },
                }));
            } else {
                actions.push(vmInput);
                actions.push(el("button", {
                    type: "button",
                    class: "btn manage attach",
                    text: _("Attach"),
                    onclick: function () {
                        const vm = vmInput.value.trim();
                        call(cockpit.format(_("Attaching $0 to $1"), shortUUID(i.UUID), vm), "Attach", "ss", [i.UUID, vm]).catch(ignore);
                    },
                }));
            }
            actions.push(el("button", {
                type: "button",
                class: "btn btn-danger manage destroy",
                text: _("Destroy"),
                onclick: function () {
                    const detach = i.VM ? window.confirm(cockpit.format(_("Instance $0 is attached to $1. Detach it first?"), shortUUID(i.UUID), i.VM)) : false;
                    call(cockpit.format(_("Destroying $0"), shortUUID(i.UUID)), "DestroyInstance", "s", [i.UUID],
                        { detach: cockpit.variant("b", detach) }).catch(ignore);
                },
            }));
            const dot = el("span", { class: "dot" });
            dot.style.background = tenantColour(i.Tenant);
            body.appendChild(el("tr", { "data-uuid": i.UUID, "data-state": i.State, class: i.State === "failed" || i.State === "lost" ? "bad" : "" }, [
                el("td", { class: "mono", title: i.UUID, text: shortUUID(i.UUID) }),
                el("td", {}, [dot, i.Tenant]),
                el("td", { text: i.Profile }),
                el("td", { text: i.Kind }),
                el("td", { class: "mono", text: i.GPU }),
                el("td", { class: "placement", text: placement(i) }),
                el("td", { class: "state state-" + i.State, title: i.Reason, text: i.State }),
                el("td", { class: "vm", text: i.VM ? i.VM + (i.Live ? " (" + _("live") + ")" : "") : "" }),
                el("td", { class: "actions" }, actions),
            ]));
        });
        if (focused) {
            const again = body.querySelector("tr[data-uuid='" + focused + "'] .vm-choice");
            if (again)
                again.focus();
        }
        const dl = $("vm-names");
        clear(dl);
        Array.from(vms).sort().forEach(function (v) {
            dl.appendChild(el("option", { value: v }));
        });
        syncManageControls();
    }

    // vmChooser is the VM field of an instance's Attach: a choice of
    // libvirt's VMs (ListDomains) with their state; when vgpud could not
    // list them (no libvirt configured, libvirt not answering), a text
    // field for a domain name, with why.
    function vmChooser() {
        if (state.domains === null) {
            return el("input", {
                class: "vm-input vm-choice",
                list: "vm-names",
                placeholder: _("VM name"),
                "aria-label": _("VM name"),
                title: state.domainsError,
            });
        }
        const sel = el("select", { class: "vm-select vm-choice", "aria-label": _("VM") }, [
            el("option", { value: "", text: state.domains.length ? _("Choose a VM") : _("no VMs in libvirt") }),
        ]);
        state.domains.forEach(function (d) {
            sel.appendChild(el("option", { value: d.name, text: d.name + " (" + d.state + ")" }));
        });
        return sel;
    }

    // loadDomains lists libvirt's VMs through vgpud, bounded by DOMAINS_MS.
    function loadDomains() {
        if (!state.canRead)
            return Promise.resolve();
        return managerCall("ListDomains", [{ "timeout-ms": cockpit.variant("t", DOMAINS_MS) }], { type: "a{sv}" }).then(function (r) {
            state.domains = r[0].map(function (d) {
                return { name: d[0], uuid: d[1], state: d[2] };
            }).sort(function (a, b) { return a.name.localeCompare(b.name); });
            state.domainsError = "";
            render();
        }, function (ex) {
            state.domains = null;
            state.domainsError = (ex.name || "") + ": " + (ex.message || "");
            render();
        });
    }

    function syncFormChoices() {
        const tnames = list(tenants).map(function (t) { return t.Name; }).sort();
        const pcis = list(gpus).map(function (g) { return g.PCI; }).sort();
        syncSelect($("filter-tenant"), tnames, true);
        syncSelect($("filter-gpu"), pcis, true);
        syncSelect($("cf-tenant"), tnames, false);
        syncSelect($("cf-gpu"), pcis, true);
    }

    // loadOffers reads the profiles of the GPU models and how many of each
    // fit now (GetCapacity); the chooser shows the creatable ones first.
    function loadOffers() {
        return Promise.all([
            managerCall("ListProfiles", [""], { type: "s" }),
            managerCall("GetCapacity", [], { type: "" }),
        ]).then(function (r) {
            const profiles = {};
            r[0][0].forEach(function (p) {
                (profiles[p[0]] = profiles[p[0]] || []).push({ name: p[1], kind: p[2], vram: p[3], compute: p[4] });
            });
            const cap = {};
            r[1][0].forEach(function (c) {
                cap[c[0] + "/" + c[1]] = c[3];
            });
            state.profiles = profiles;
            state.capacity = cap;
            renderProfileChooser();
        });
    }

    function renderProfileChooser() {
        const sel = $("cf-profile");
        const cur = sel.value;
        clear(sel);
        const pci = $("cf-gpu").value;
        const models = Array.from(new Set(list(gpus).filter(function (g) {
            return !pci || g.PCI === pci;
        }).map(function (g) { return g.Model; }).filter(Boolean))).sort();
        models.forEach(function (m) {
            const group = el("optgroup", { label: m });
            (state.profiles[m] || []).slice().sort(function (a, b) {
                const ca = state.capacity[m + "/" + a.name] || 0;
                const cb = state.capacity[m + "/" + b.name] || 0;
                return (cb > 0) - (ca > 0) || a.vram - b.vram;
            }).forEach(function (p) {
                const n = state.capacity[m + "/" + p.name] || 0;
                // Profile names are given with their model (MODEL/NAME), so
                // a name two models share goes to the chosen one.
                group.appendChild(el("option", {
                    value: m + "/" + p.name,
                    "data-free": n,
                    text: cockpit.format(_("$0 — $1, $2 GPU — $3 free now"), p.name, gib(p.vram), gpusText(p.compute), n),
                }));
            });
            sel.appendChild(group);
        });
        if (cur && sel.querySelector("option[value='" + cur.replace(/'/g, "") + "']"))
            sel.value = cur;
        updatePlan();
    }

    function createArgs() {
        const opts = { "timeout-ms": cockpit.variant("t", TIMEOUT_MS) };
        if ($("cf-gpu").value)
            opts.gpu = cockpit.variant("s", $("cf-gpu").value);
        // The chooser's values are MODEL/NAME; the plain name goes when it
        // names one profile here (the GPU is pinned, or one model has it),
        // so the instance's Profile reads as an operator would type it.
        let profile = $("cf-profile").value;
        const slash = profile.indexOf("/");
        if (slash > 0) {
            const name = profile.substring(slash + 1);
            const models = Object.keys(state.profiles).filter(function (m) {
                return state.profiles[m].some(function (p) { return p.name === name; });
            });
            if (opts.gpu || models.length === 1)
                profile = name;
        }
        return [$("cf-tenant").value, profile, opts];
    }

    // updatePlan shows where the chosen profile would go (Plan: nothing
    // changes) and whether the tenant's quota admits it.
    function updatePlan() {
        const out = $("cf-plan");
        const a = createArgs();
        if (!state.canRead || !a[1]) {
            out.textContent = "";
            return;
        }
        const opts = {};
        if (a[2].gpu)
            opts.gpu = a[2].gpu;
        managerCall("Plan", [a[0], a[1], opts], { type: "ssa{sv}" }).then(function (r) {
            const fits = r[0];
            const gpu = r[2];
            const start = r[4];
            const device = r[5];
            const refusal = r[9];
            const quotaOK = r[10];
            const quotaMsg = r[11];
            let t;
            if (fits)
                t = start >= 0 ? cockpit.format(_("Would go to $0, slot $1."), gpu, start) : cockpit.format(_("Would go to $0 $1."), gpu, device);
            else
                t = _("Does not fit now:") + " " + refusal;
            if (!quotaOK)
                t += " " + _("Quota:") + " " + quotaMsg;
            out.textContent = t;
            out.className = "plan " + (fits && quotaOK ? "ok" : "refused");
        }).catch(function (ex) {
            out.textContent = (ex.name || "") + ": " + ex.message;
            out.className = "plan refused";
        });
    }

    /* ---------- activity ---------- */

    function fmtShare(v) {
        return v < 0 ? "–" : String(Math.round(v) / 1000);
    }

    function loadActivity() {
        if (!state.canRead)
            return;
        managerCall("GetShares", [], { type: "" }).then(function (r) {
            state.shares = r[0];
            renderActivity();
        }).catch(showError);
    }

    function renderActivity() {
        const body = $("activity");
        clear(body);
        const byUUID = {};
        list(instances).forEach(function (i) { byUUID[i.UUID] = i; });
        state.shares.forEach(function (s) {
            const i = byUUID[s[0]] || {};
            const interf = s[4];
            const fill = el("div", { class: "fill" + (interf > 0.2 ? " full" : interf > 0.05 ? " high" : "") });
            fill.style.width = (interf < 0 ? 0 : Math.min(100, 100 * interf)) + "%";
            body.appendChild(el("tr", { "data-uuid": s[0] }, [
                el("td", { class: "mono", title: s[0], text: shortUUID(s[0]) }),
                el("td", { text: i.Tenant || "" }),
                el("td", { text: i.Profile || "" }),
                el("td", { text: fmtShare(s[1]) }),
                el("td", { text: fmtShare(s[2]) }),
                el("td", { text: fmtShare(s[3]) }),
                el("td", {}, [el("div", { class: "usage" }, [
                    el("div", { class: "bar" }, [fill]),
                    el("span", { class: "usage-text", text: interf < 0 ? "–" : String(Math.round(interf * 1000) / 1000) }),
                ])]),
            ]));
        });
        if (state.shares.length === 0)
            body.appendChild(el("tr", {}, [el("td", { colspan: 7, class: "muted", text: _("No instances.") })]));
    }

    /* ---------- fleet ---------- */

    function loadFleet() {
        const box = $("fleet");
        if (!state.canRead)
            return;
        managerCall("GetFleetStatus", [], { type: "" }).then(function (r) {
            clear(box);
            const last = r[3] > 0 ? new Date(r[3]).toISOString() : _("never");
            box.appendChild(el("dl", { class: "kv" }, [
                el("dt", { text: _("Placement") }), el("dd", { text: r[0] }),
                el("dt", { text: _("Host") }), el("dd", { text: r[1] }),
                el("dt", { text: _("Root provider") }), el("dd", { class: "mono", text: r[2] }),
                el("dt", { text: _("Last sync") }), el("dd", { text: last }),
                el("dt", { text: _("Last error") }), el("dd", { text: r[4] || "–" }),
            ]));
            const rows = [];
            r[5].forEach(function (p) {
                p[6].forEach(function (c) {
                    rows.push(el("tr", {}, [
                        el("td", { text: p[2] }), el("td", { text: p[1] }), el("td", { text: p[3] ? _("yes") : _("no") }),
                        el("td", { text: c[0] }), el("td", { text: c[1] + " / " + c[4] }), el("td", { text: c[6] }),
                    ]));
                });
            });
            box.appendChild(el("table", { class: "table" }, [
                el("thead", {}, [el("tr", {}, [_("GPU"), _("Provider"), _("In Placement"), _("Class"), _("Total host / Placement"), _("Used in Placement")].map(function (h) {
                    return el("th", { text: h });
                }))]),
                el("tbody", {}, rows),
            ]));
            const diffs = r[6];
            box.appendChild(el("h2", { text: cockpit.format(_("Differences: $0"), diffs.length) }));
            box.appendChild(el("ul", {}, diffs.map(function (d) {
                return el("li", { text: d[0] + " " + d[2] + ": host " + d[3] + ", Placement " + d[4] });
            })));
        }).catch(function (ex) {
            clear(box);
            box.appendChild(el("div", { class: "alert alert-info", id: "fleet-unavailable" }, [
                el("strong", { text: ex.name || "" }), " ", ex.message,
            ]));
        });
    }

    /* ---------- rendering ---------- */

    // loadManager reads the manager's own properties: GetManagedObjects
    // lists the objects below /dev/vgpud1, not the manager object itself.
    function loadManager() {
        new Promise(function (resolve, reject) {
            client.call(ROOT, "org.freedesktop.DBus.Properties", "GetAll", [MANAGER], { type: "s" }).then(resolve, reject);
        }).then(function (r) {
            const props = {};
            Object.keys(r[0]).forEach(function (k) {
                props[k] = r[0][k].v;
            });
            state.manager = props;
            render();
        }).catch(ignore);
    }

    let renderPending = false;
    function render() {
        if (renderPending)
            return;
        renderPending = true;
        window.setTimeout(function () {
            renderPending = false;
            const m = state.manager;
            $("version").textContent = m.Version ? cockpit.format(_("vgpud $0, driver $1"), m.Version, m.DriverVersion || "–") : "";
            $("degraded").hidden = !m.Degraded;
            $("degraded").textContent = m.Degraded ? _("Carving is refused:") + " " + m.Degraded : "";
            syncFormChoices();
            renderGPUs();
            renderTenants();
            renderInstances();
            if (state.tab === "activity")
                renderActivity();
        }, 0);
    }

    function showTab(name) {
        state.tab = name;
        document.querySelectorAll(".tabs button").forEach(function (b) {
            b.classList.toggle("active", b.dataset.tab === name);
            b.setAttribute("aria-selected", b.dataset.tab === name ? "true" : "false");
        });
        document.querySelectorAll(".page").forEach(function (p) {
            p.hidden = p.id !== "page-" + name;
        });
        window.clearInterval(state.activityTimer);
        state.activityTimer = null;
        if (name === "activity") {
            loadActivity();
            state.activityTimer = window.setInterval(loadActivity, ACTIVITY_MS);
        } else if (name === "fleet") {
            loadFleet();
        } else if (name === "instances") {
            loadOffers().catch(showError);
            loadDomains();
        }
        if (cockpit.location.path[0] !== name)
            cockpit.location.go([name]);
    }

    /* ---------- wiring ---------- */

    function wire() {
        cockpit.translate();
        document.querySelectorAll(".tabs button").forEach(function (b) {
            b.addEventListener("click", function () { showTab(b.dataset.tab); });
        });
        $("error-close").addEventListener("click", clearError);
        $("filter-tenant").addEventListener("change", renderInstances);
        $("filter-gpu").addEventListener("change", renderInstances);
        $("filter-text").addEventListener("input", renderInstances);
        $("cf-gpu").addEventListener("change", renderProfileChooser);
        $("cf-profile").addEventListener("change", updatePlan);
        $("cf-tenant").addEventListener("change", updatePlan);
        $("cf-create").addEventListener("click", function () {
            const a = createArgs();
            call(cockpit.format(_("Creating $0 for $1"), a[1], a[0]), "CreateInstance", "ss", [a[0], a[1]])
                    .then(function () { return loadOffers(); })
                    .catch(ignore);
        });
        $("tf-define").addEventListener("click", function () {
            const a = tenantFormArgs();
            if (!a)
                return;
            call(cockpit.format(_("Defining $0"), a.args[0]), "DefineTenant", "sttts", a.args.concat([$("tf-class").value]), a.options).catch(ignore);
        });
        $("tf-setquota").addEventListener("click", function () {
            const a = tenantFormArgs();
            if (!a)
                return;
            call(cockpit.format(_("Setting the quota of $0"), a.args[0]), "SetQuota", "sttt", a.args, a.options).catch(ignore);
        });
        $("fleet-refresh").addEventListener("click", loadFleet);

        [gpus, instances, tenants].forEach(function (p) {
            p.addEventListener("added", render);
            p.addEventListener("changed", render);
            p.addEventListener("removed", render);
        });
        manager.addEventListener("changed", loadManager);
        instances.addEventListener("added", function () { if (state.tab === "activity") loadActivity(); });
        instances.addEventListener("removed", function () { if (state.tab === "activity") loadActivity(); });
        cockpit.addEventListener("locationchanged", function () {
            const p = cockpit.location.path[0];
            if (p && p !== state.tab && $("page-" + p))
                showTab(p);
        });

        client.addEventListener("close", function (ev, options) {
            $("conn").textContent = _("disconnected");
            $("conn").className = "badge state-failed";
            showError({ name: options.problem || "", message: cockpit.message(options) });
        });

        // vgpud says what this session may do (GetAccess, which anyone may
        // ask): the page shows the data to a reader, the change controls
        // only to whom vgpud lets change, and vgpud's reason otherwise.
        managerCall("GetAccess", [], { type: "" }).then(function (r) {
            if (!r[0]) {
                setAccess(false, false, ERROR_PREFIX + "AccessDenied: " + r[2]);
                $("conn").textContent = _("no access");
                $("conn").className = "badge state-lost";
                return;
            }
            setAccess(true, r[1], r[2]);
            loadManager();
            $("conn").textContent = r[1] ? _("connected") : _("read-only");
            $("conn").className = "badge " + (r[1] ? "state-ok" : "state-lost");
            return Promise.all([loadOffers(), loadDomains()]);
        }).catch(function (ex) {
            setAccess(false, false, (ex.name || ex.problem || "") + ": " + (ex.message || cockpit.message(ex)));
            $("conn").textContent = _("unavailable");
            $("conn").className = "badge state-failed";
            showError(ex);
        }).then(render);

        const first = cockpit.location.path[0];
        showTab(first && $("page-" + first) ? first : "gpus");
        syncManageControls();
        document.body.setAttribute("data-ready", "1");
    }

    // For the browser tests: the page's client, to call vgpud as the page does.
    window.vgpudPage = { client: client, state: state };

    wire();
}());
