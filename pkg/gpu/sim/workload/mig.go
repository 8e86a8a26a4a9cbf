package workload

import "math"

// MIG: each instance runs on its GPU instance's own slices; neighbours
// share only the power limit, which sets the clock of all of them.

// segment computes, for the current demands, the clock factor the power
// limit allows and each GPU instance's busy fraction and work rate.
func (r *GPURun) segment() {
	if r.segValid {
		return
	}
	r.segValid = true
	dem, pw := map[int]float64{}, map[int]float64{}
	share := map[int]float64{}
	for _, x := range r.order {
		dem[x.gi] += x.level
		w := x.w.Power
		if w == 0 {
			w = 1
		}
		pw[x.gi] += x.level * w
		share[x.gi] = x.share
	}
	cal := r.e.cal
	dyn := (float64(r.pm.TDPW) - r.pm.IdleW) * cal.MIGPower
	power := func(cf float64) float64 {
		p := r.pm.IdleW
		for gi, d := range dem {
			e := share[gi]
			if d <= 0 || e <= 0 {
				continue
			}
			w := pw[gi] / d
			p += dyn * e * w * math.Min(cf, d/e) * math.Pow(cf, cal.PowerExponent-1)
		}
		return p
	}
	r.cf = clockFor(r.capW, power)
	r.powerW = power(r.cf)
	r.segBusy, r.segWork, r.segDem = map[int]float64{}, map[int]float64{}, dem
	for gi, d := range dem {
		e := share[gi]
		if e <= 0 {
			continue
		}
		r.segBusy[gi] = math.Min(1, d/(e*r.cf))
		r.segWork[gi] = math.Min(d, e*r.cf)
	}
}

func (r *GPURun) runMIG(to int64) {
	for r.t < to {
		r.segment()
		end := min(to, r.nextTrace(), r.nextBucket())
		dt := float64(end - r.t)
		busy := 0.0
		throttled := r.cf < 1
		for _, x := range r.order {
			x.t.demand += x.level * dt
			b := r.segBusy[x.gi]
			if d := r.segDem[x.gi]; d > 0 {
				x.t.work += r.segWork[x.gi] * dt * x.level / d
			}
			x.t.run += b * dt
			x.bucketRun += b * dt
			if throttled {
				x.t.throttle[reasonPowerCap] += b * dt
			}
		}
		for gi, b := range r.segBusy {
			g := r.gis[gi]
			if g == nil {
				g = &giRun{}
				r.gis[gi] = g
			}
			g.busy += b * dt
			g.dram += b * memPerSM * dt
			for _, x := range r.order {
				if x.gi == gi {
					busy += b * x.share
					break
				}
			}
		}
		r.account(dt, busy, r.powerW, throttled)
		r.t = end
		r.traceStep()
		r.flushBuckets()
	}
}
