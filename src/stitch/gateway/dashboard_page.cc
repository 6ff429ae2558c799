#include "stitch/gateway/dashboard_page.h"

namespace stitch {

namespace {

// Kept in one raw string so that the binary serves it without files; the
// script draws SVG by hand (a few dozen lines) rather than vendoring a
// charting library. Element ids are what tests/dashboard_browser_test.cc
// reads.
constexpr std::string_view kPage = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>stitch gateway</title>
<style>
body{font:13px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 16px;display:flex;flex-wrap:wrap;gap:18px;align-items:baseline}
header h1{font-size:16px;margin:0}
header .big{font-size:20px;font-weight:600}
main{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:12px;padding:12px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px;min-width:0}
section.wide{grid-column:1/-1}
h2{font-size:13px;margin:0 0 6px;color:#444}
svg{width:100%;display:block}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{text-align:left;padding:3px 6px;border-bottom:1px solid #eee;white-space:nowrap}
td.err{white-space:normal;color:#a22;max-width:420px}
tr.sel{background:#fff4c2}
tbody tr{cursor:pointer}
.st{display:inline-block;padding:0 6px;border-radius:8px;color:#fff;font-size:11px}
#events{max-height:220px;overflow:auto;margin:0;padding-left:36px;font-size:12px}
.muted{color:#777}
.legend span{margin-right:10px;white-space:nowrap}
.legend i{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
#problem{color:#ffb4b4}
.scroll{max-height:520px;overflow:auto}
thead th{position:sticky;top:0;background:#fff}
</style></head><body>
<header><h1>stitch gateway</h1>
<span>pointer <span class="big" id="pointer">?</span></span>
<span id="summary" class="muted">waiting for /ui/state</span>
<span id="rates"></span><span id="problem"></span></header>
<main>
<section class="wide"><h2>Applied versions against the store's pointer <span class="muted">(dashed: pointer; line: oldest applied; band: oldest to newest applied)</span></h2>
<svg id="fleet" height="150"></svg></section>
<section class="wide"><h2>Replicas over time <span class="muted" id="lanes-note"></span>
<input id="filter" placeholder="filter by URL or state" style="margin-left:12px"></h2>
<div class="legend" id="state-legend"></div><svg id="lanes" height="40"></svg></section>
<section><h2>Rollouts per second by served version</h2><svg id="served" height="130"></svg>
<div class="legend" id="served-legend"></div></section>
<section><h2>Staleness of what was served (pointer &minus; served version), last 60 s</h2>
<svg id="staleness" height="130"></svg></section>
<section><h2>409, 503 and retries per second</h2><svg id="errors" height="110"></svg>
<div class="legend"><span><i style="background:#d9822b"></i>409</span><span><i style="background:#c23030"></i>503</span><span><i style="background:#7157d9"></i>retries</span></div></section>
<section><h2>Time from publish to the whole fleet</h2><table><thead><tr><th>version</th><th>seen</th><th>whole fleet after</th></tr></thead><tbody id="rollouts"></tbody></table></section>
<section class="wide"><h2>Replicas <span class="muted">(click a row to follow it above; the filter applies here too)</span></h2>
<div class="scroll"><table><thead><tr><th>replica</th><th>state</th><th>version</th><th>behind</th><th>in flight</th><th>joined</th><th>last staged</th><th>last committed</th><th>stage / commit s</th><th>last error</th><th>store notice</th></tr></thead>
<tbody id="replicas"></tbody></table></div></section>
<section class="wide"><h2>State changes, newest first</h2><ol id="events" reversed></ol></section>
</main>
<script>
"use strict";
const COLORS={joined:"#5b8def",serving:"#2e9b57",held:"#2b8fa8",staging:"#d9a72b",committing:"#e07b1f",paused:"#8a8f99",stalled:"#b0457a",error:"#c23030",unreachable:"#55585e",gone:"#cfd3da"};
const PALETTE=["#2f6fdf","#2e9b57","#d9822b","#7157d9","#c23030","#1f9fb0","#b0457a","#6b8e23"];
const NS="http://www.w3.org/2000/svg";
let selected=null, last=null, updates=0;
const $=id=>document.getElementById(id);
function el(tag,attrs,text){const e=document.createElementNS(NS,tag);for(const k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=text;return e;}
function ago(t,now){if(t===null||t===undefined)return "";const s=now-t;return s<60?s.toFixed(1)+" s ago":(s/60).toFixed(1)+" min ago";}
function vname(v){return v===null||v===undefined?"none":"v"+v;}
function clear(svg){while(svg.firstChild)svg.removeChild(svg.firstChild);return svg.clientWidth||900;}
function axis(svg,w,h,x0,t0,t1,left){
  svg.appendChild(el("line",{x1:left,y1:h-14,x2:w,y2:h-14,stroke:"#ccc"}));
  const span=t1-t0;const step=span>240?60:span>90?30:10;
  for(let s=0;s<=span;s+=step){const x=x0(t1-s);svg.appendChild(el("text",{x:x,y:h-2,"font-size":10,"text-anchor":"middle",fill:"#888"},s===0?"now":"-"+s+"s"));}
}
function drawFleet(d){
  const svg=$("fleet"),w=clear(svg),h=150,left=40;const t1=d.now,t0=Math.max(0,t1-d.window);
  const x=t=>left+(w-left-8)*(t-t0)/Math.max(1,t1-t0);
  const vs=[];for(const s of d.samples){for(const v of [s[1],s[2],s[3]])if(v!==null)vs.push(v);}
  if(d.pointer!==null)vs.push(d.pointer);
  if(!vs.length){svg.appendChild(el("text",{x:left,y:60,fill:"#888"},"no versions reported yet"));return;}
  const lo=Math.min(...vs),hi=Math.max(...vs,lo+1);const y=v=>8+(h-30)*(hi-v)/(hi-lo);
  for(const v of [lo,Math.round((lo+hi)/2),hi]){svg.appendChild(el("text",{x:4,y:y(v)+4,"font-size":10,fill:"#888"},"v"+v));svg.appendChild(el("line",{x1:left,x2:w,y1:y(v),y2:y(v),stroke:"#f0f0f0"}));}
  let band="",lower=[];
  for(const s of d.samples){if(s[2]===null)continue;band+=(band?"L":"M")+x(s[0])+","+y(s[3]);lower.unshift(x(s[0])+","+y(s[2]));}
  if(band)svg.appendChild(el("path",{d:band+"L"+lower.join("L")+"Z",fill:"#2e9b57",opacity:0.3}));
  let old="",po=null;for(const s of d.samples){if(s[2]===null)continue;if(po!==null)old+="L"+x(s[0])+","+y(po);old+=(old?"L":"M")+x(s[0])+","+y(s[2]);po=s[2];}
  if(old)svg.appendChild(el("path",{d:old,fill:"none",stroke:"#2e9b57","stroke-width":1.5}));
  let p="";let prev=null;for(const m of d.pointer_moves){if(m[0]<t0)continue;if(prev!==null)p+="L"+x(m[0])+","+y(prev);p+=(p?"L":"M")+x(m[0])+","+y(m[1]);prev=m[1];}
  if(prev!==null){p+="L"+x(t1)+","+y(prev);svg.appendChild(el("path",{d:p,fill:"none",stroke:"#1d2330","stroke-dasharray":"5 3","stroke-width":1.5}));}
  axis(svg,w,h,x,t0,t1,left);
}
function lanesToShow(d){
  const f=$("filter").value.trim().toLowerCase();
  let rs=d.replicas.filter(r=>!f||r.url.toLowerCase().includes(f)||r.state.includes(f));
  if(selected)rs=rs.filter(r=>r.url===selected).concat(rs.filter(r=>r.url!==selected));
  const bad=r=>(r.state==="serving"?1:0)*1e9-(d.pointer!==null&&r.version!==null?d.pointer-r.version:1e6);
  if(!selected&&rs.length>24)rs=rs.slice().sort((a,b)=>bad(a)-bad(b));
  $("lanes-note").textContent=rs.length>24?"(24 of "+rs.length+" shown, those furthest behind first; filter or click a row)":"";
  return rs.slice(0,24);
}
function drawLanes(d){
  const rs=lanesToShow(d),lh=22,left=170,h=rs.length*lh+18;const svg=$("lanes");svg.setAttribute("height",h);const w=clear(svg);
  const t1=d.now,t0=Math.max(0,t1-d.window);const x=t=>left+(w-left-8)*(Math.max(t,t0)-t0)/Math.max(1,t1-t0);
  rs.forEach((r,i)=>{
    const y0=i*lh;const g=el("g",{"data-url":r.url});
    g.appendChild(el("text",{x:4,y:y0+15,"font-size":11,fill:r.url===selected?"#b8860b":"#333"},r.url.replace(/^https?:\/\//,"")));
    const ev=r.events;
    for(let k=0;k<ev.length;k++){
      const e=ev[k];if(e[1]==="joined")continue;const end=k+1<ev.length?ev[k+1][0]:t1;if(end<t0)continue;
      const rect=el("rect",{x:x(e[0]),y:y0+3,width:Math.max(1,x(end)-x(e[0])),height:lh-6,fill:COLORS[e[1]]||"#999",opacity:0.85});
      rect.appendChild(el("title",{},e[1]+" "+vname(e[2])+(e[3]?": "+e[3]:"")));g.appendChild(rect);
      if(x(end)-x(e[0])>26&&e[2]!==null)g.appendChild(el("text",{x:x(e[0])+3,y:y0+15,"font-size":10,fill:"#fff"},"v"+e[2]));
    }
    for(const e of ev){if(e[0]<t0)continue;const c=el("circle",{cx:x(e[0]),cy:y0+lh/2,r:3,fill:"#fff",stroke:COLORS[e[1]]||"#333"});
      c.appendChild(el("title",{},e[1]+" "+vname(e[2])+(e[3]?": "+e[3]:"")));g.appendChild(c);}
    svg.appendChild(g);
  });
  axis(svg,w,h,x,t0,t1,left);
}
function bars(svg,h,cols,series,colorOf,left){
  const w=clear(svg);const n=cols.length;const max=Math.max(1,...cols.map(c=>series.reduce((a,s)=>a+(c[s]||0),0)));
  const bw=(w-left-4)/Math.max(n,1);
  svg.appendChild(el("text",{x:2,y:12,"font-size":10,fill:"#888"},String(max)));
  cols.forEach((c,i)=>{let y=h-14;for(const s of series){const v=c[s]||0;if(!v)continue;const bh=(h-30)*v/max;y-=bh;
    const r=el("rect",{x:left+i*bw,y:y,width:Math.max(1,bw-1),height:bh,fill:colorOf(s)});r.appendChild(el("title",{},s+": "+v));svg.appendChild(r);}});
  return {w,bw};
}
function drawServed(d){
  const n=120,cols=[],series=new Set();const now=Math.floor(d.now);const by=new Map(d.seconds.map(s=>[s.t,s]));
  for(let t=now-n+1;t<=now;t++){const s=by.get(t);const c={};if(s)for(const k in s.served){c[k]=s.served[k];series.add(k);}cols.push(c);}
  const order=[...series].sort((a,b)=>(a==="?")-(b==="?")||Number(a)-Number(b));
  const color=k=>k==="?"?"#999":PALETTE[Number(k)%PALETTE.length];
  bars($("served"),130,cols,order,color,24);
  const leg=$("served-legend");leg.textContent="";
  for(const k of order){const recent=cols.slice(-10).reduce((a,c)=>a+(c[k]||0),0)/10;const s=document.createElement("span");
    s.innerHTML='<i style="background:'+color(k)+'"></i>';s.appendChild(document.createTextNode((k==="?"?"unknown":"v"+k)+" "+recent.toFixed(1)+"/s"));leg.appendChild(s);}
}
function drawStaleness(d){
  const labels=["0","1","2","3","4","5+","?"],tot=[0,0,0,0,0,0,0];
  for(const s of d.seconds)if(s.t>d.now-60)s.staleness.forEach((v,i)=>tot[i]+=v);
  const svg=$("staleness"),h=130,w=clear(svg),max=Math.max(1,...tot),bw=(w-30)/labels.length;const sum=tot.reduce((a,b)=>a+b,0);
  labels.forEach((l,i)=>{const bh=(h-34)*tot[i]/max;svg.appendChild(el("rect",{x:20+i*bw,y:h-16-bh,width:bw-6,height:bh,fill:i===0?"#2e9b57":i<6?"#d9822b":"#999"}));
    svg.appendChild(el("text",{x:20+i*bw+(bw-6)/2,y:h-4,"font-size":10,"text-anchor":"middle",fill:"#555"},l+" behind"));
    svg.appendChild(el("text",{x:20+i*bw+(bw-6)/2,y:h-20-bh,"font-size":10,"text-anchor":"middle",fill:"#333"},sum?Math.round(100*tot[i]/sum)+"%":""));});
}
function drawErrors(d){
  const n=120,cols=[];const now=Math.floor(d.now);const by=new Map(d.seconds.map(s=>[s.t,s]));
  for(let t=now-n+1;t<=now;t++){const s=by.get(t);cols.push(s?{c409:s.conflicts,c503:s.unavailable,retries:s.retries}:{});}
  bars($("errors"),110,cols,["c409","c503","retries"],k=>({c409:"#d9822b",c503:"#c23030",retries:"#7157d9"})[k],24);
  const r=k=>(cols.slice(-10).reduce((a,c)=>a+(c[k]||0),0)/10).toFixed(1);
  $("rates").textContent="409/s "+r("c409")+"  503/s "+r("c503")+"  retries/s "+r("retries");
}
function cell(tr,text,cls){const td=document.createElement("td");td.textContent=text;if(cls)td.className=cls;tr.appendChild(td);return td;}
function drawTable(d){
  const tb=$("replicas");tb.textContent="";const f=$("filter").value.trim().toLowerCase();
  for(const r of d.replicas){
    if(f&&!r.url.toLowerCase().includes(f)&&!r.state.includes(f))continue;
    const tr=document.createElement("tr");tr.dataset.url=r.url;tr.className=(r.url===selected?"sel ":"")+"replica";
    cell(tr,r.url);const st=cell(tr,"");const b=document.createElement("span");b.className="st state";b.style.background=COLORS[r.state]||"#999";b.textContent=r.state;st.appendChild(b);
    cell(tr,vname(r.version));cell(tr,d.pointer!==null&&r.version!==null?String(d.pointer-r.version):"");
    cell(tr,r.in_flight===undefined?"":String(r.in_flight));cell(tr,ago(r.joined,d.now));cell(tr,ago(r.last_stage,d.now));cell(tr,ago(r.last_commit,d.now));
    cell(tr,(r.stage_s!==undefined?r.stage_s.toFixed(2):"-")+" / "+(r.commit_s!==undefined?r.commit_s.toFixed(2):"-"));
    cell(tr,r.last_error?r.last_error+" ("+ago(r.last_error_at,d.now)+")":"","err");
    cell(tr,r.pointer_notice||"","err notice");
    tr.onclick=()=>{selected=selected===r.url?null:r.url;render();};tb.appendChild(tr);
  }
}
function drawRollouts(d){
  const tb=$("rollouts");tb.textContent="";
  for(const r of d.rollouts.slice().reverse().slice(0,12)){const tr=document.createElement("tr");
    cell(tr,"v"+r[0]);cell(tr,ago(r[1],d.now));cell(tr,r[2]===null?"pending ("+(d.now-r[1]).toFixed(1)+" s)":r[2].toFixed(1)+" s");tb.appendChild(tr);}
}
function drawEvents(d){
  const ol=$("events");ol.textContent="";
  for(const e of d.events.slice().reverse()){const li=document.createElement("li");li.className="event";li.dataset.state=e[2];
    li.textContent=ago(e[0],d.now)+"  "+e[1]+"  "+e[2]+"  "+vname(e[3])+(e[4]?": "+e[4]:"");ol.appendChild(li);}
}
function render(){
  const d=last;if(!d)return;
  $("pointer").textContent=d.pointer===null?"none":"v"+d.pointer;
  const counts={};for(const r of d.replicas)counts[r.state]=(counts[r.state]||0)+1;
  $("summary").textContent=d.replicas.length+" replicas: "+Object.keys(counts).sort().map(k=>counts[k]+" "+k).join(", ");
  const leg=$("state-legend");leg.textContent="";for(const k in COLORS){const s=document.createElement("span");s.innerHTML='<i style="background:'+COLORS[k]+'"></i>'+k;leg.appendChild(s);}
  drawFleet(d);drawLanes(d);drawServed(d);drawStaleness(d);drawErrors(d);drawTable(d);drawRollouts(d);drawEvents(d);
  document.body.dataset.updates=String(++updates);
}
// A fleet with a bearer token: open /ui#token=TOKEN (the fragment never
// leaves the browser); the script presents it as /replicas wants it.
const token=new URLSearchParams(location.hash.slice(1)).get("token");
async function poll(){
  try{const r=await fetch("/ui/state",{cache:"no-store",headers:token?{Authorization:"Bearer "+token}:{}});
    if(r.status===401)throw new Error("this gateway needs the fleet's bearer token: open /ui#token=TOKEN");
    if(!r.ok)throw new Error("HTTP "+r.status);last=await r.json();$("problem").textContent="";render();}
  catch(e){$("problem").textContent="no state from the gateway: "+e.message;}
  setTimeout(poll,1000);
}
$("filter").oninput=render;
poll();
</script></body></html>
)html";

}  // namespace

std::string_view DashboardPage() { return kPage; }

}  // namespace stitch
