package profile

// IsModelName reports whether s has the form of a catalog model name
// ("H100-SXM5-80GB"), whether or not this catalog has the model.
func IsModelName(s string) bool { return modelNameRE.MatchString(s) }

// IsProfileName reports whether s has the form of a profile name as a
// tenant's allow-list holds it: a MIG GPU-instance profile ("3g.40gb"), a
// compute-instance profile ("1c.3g.40gb"), a vGPU type ("L4-4Q",
// "H100XM-3-40C") or "passthrough", whether or not this catalog has it.
func IsProfileName(s string) bool {
	return s == "passthrough" || giNameRE.MatchString(s) || ciNameRE.MatchString(s) || typeNameRE.MatchString(s)
}

// HasModel reports whether the catalog has a model of that name.
func (c *Catalog) HasModel(name string) bool {
	_, ok := c.Model(name)
	return ok
}

// HasProfile reports whether any model of the catalog has a MIG profile
// (GPU- or compute-instance) or vGPU type of that name ("passthrough": any model).
func (c *Catalog) HasProfile(name string) bool {
	for _, m := range c.models {
		if name == "passthrough" {
			return true
		}
		if _, ok := m.GPUInstanceProfileByName(name); ok {
			return true
		}
		if _, _, ok := m.ComputeInstanceByName(name); ok {
			return true
		}
		if _, ok := m.VGPUTypeByName(name); ok {
			return true
		}
	}
	return false
}
